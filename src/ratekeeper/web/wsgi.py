"""Rate limits for any WSGI app (Flask, Bottle, Falcon, Pyramid, Django's WSGI handler).

::

    from ratekeeper.web import WSGIRateLimitMiddleware

    app.wsgi_app = WSGIRateLimitMiddleware(app.wsgi_app, rules="rules.yaml", store="redis://cache:6379/0")

A plain WSGI callable around the app. Each request is decided by the shared core
(``ratekeeper.web.core.RateLimitCore``; its options, ``ratekeeper.web.base``, are taken
here as keywords) with the blocking ``Limiter``, before the app sees it:

- denied: the app is not called; the client gets the core's 429 (problem+json body,
  ``Retry-After``, the rate-limit headers);
- allowed: the app runs as it would without the middleware, and the rate-limit headers
  are added to whatever it answers, an error page sent through ``start_response`` with
  ``exc_info`` included. Its body iterable is returned as it is, chunk for chunk, unless
  something must happen after the response (a refund by status, a concurrency lease to
  release): then it is wrapped in an iterable that yields the same chunks and whose
  ``close()`` closes the app's iterable first and then gives back what is due, and
  settles what the response cost (``response_cost``: its header, or what the app added
  to ``ratekeeper.web.usage(environ)`` while it streamed; a server calls ``close()`` also
  when the client went away mid-stream, so that is what was streamed so far);
- exempt, or no rule applies: the app is called with the environ and ``start_response``
  untouched.

What the rules see of a request: the path is ``SCRIPT_NAME + PATH_INFO`` (what the
client asked for, also when the app is mounted under a prefix), the peer is
``REMOTE_ADDR``, headers are the ``HTTP_*`` variables plus ``CONTENT_TYPE`` /
``CONTENT_LENGTH``, ``{user}`` is ``REMOTE_USER`` unless a ``user=`` callable (given the
``RequestView``, whose ``native`` is the environ) says otherwise (without one, a rule
keyed by ``{user}`` alone is warned at start: only the server sets ``REMOTE_USER``). WSGI
has no router the middleware could ask, so ``{route}`` is unknown here: a rule whose key
needs it (and has no fallback such as ``{route|client_ip}``) is a ``ConfigurationError``
at start (``WSGI_PROVIDES``, ``ratekeeper.web.keyable``); the Flask extension knows routes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from http import HTTPStatus
from types import TracebackType
from typing import Any

from ratekeeper.web.core import RateLimitCore
from ratekeeper.web.keyable import NO_ROUTER, REMOTE_USER, Provides
from ratekeeper.web.request import RequestView, Verdict
from ratekeeper.web.settle import ResponseRecord

__all__ = ["WSGI_PROVIDES", "EnvironHeaders", "WSGIRateLimitMiddleware", "request_view"]

Environ = dict[str, Any]
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


# Headers that WSGI does not carry as HTTP_* variables (PEP 3333).
_CGI_HEADERS = {"CONTENT_TYPE": "content-type", "CONTENT_LENGTH": "content-length"}


def _text(value: str) -> str:
    """A WSGI "native string" (bytes as latin-1) as the text the client sent (UTF-8)."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


class EnvironHeaders(Mapping[str, str]):
    """The request headers of a WSGI environ by lower-case name, read from it on demand
    (a request's rules usually read one header or none: no dict is built)."""

    __slots__ = ("_environ",)

    def __init__(self, environ: Environ) -> None:
        self._environ = environ

    @staticmethod
    def _variable(name: str) -> str:
        key = name.upper().replace("-", "_")
        return key if key in _CGI_HEADERS else f"HTTP_{key}"

    def __getitem__(self, name: str) -> str:
        value = self._environ.get(self._variable(name))
        if not value:  # a CGI variable may be present and empty: the header was not sent
            raise KeyError(name)
        return str(value)

    def get(self, name: str, default: Any = None) -> Any:
        value = self._environ.get(self._variable(name))
        return str(value) if value else default

    def __iter__(self) -> Iterator[str]:
        for name, value in self._environ.items():
            if name.startswith("HTTP_"):
                yield name[5:].replace("_", "-").lower()
            elif name in _CGI_HEADERS and value:
                yield _CGI_HEADERS[name]

    def __len__(self) -> int:
        return sum(1 for _ in self)


def request_view(environ: Environ) -> RequestView:
    """What the core sees of the request ``environ`` describes (see the module docstring)."""
    host = environ.get("HTTP_HOST")
    if not host and environ.get("SERVER_NAME"):
        host = f"{environ['SERVER_NAME']}:{environ.get('SERVER_PORT', '')}".rstrip(":")
    path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
    query = environ.get("QUERY_STRING", "")
    # positional: the fields in ``RequestView``'s order (cheaper to pass than keywords)
    return RequestView(
        environ.get("REQUEST_METHOD", "GET"),  # method
        (path if path.isascii() else _text(path)) or "/",  # path
        host,
        EnvironHeaders(environ),  # headers
        query if query.isascii() else _text(query),  # query_string
        environ.get("REMOTE_ADDR") or None,  # peer
        environ.get("REMOTE_USER") or None,  # user
        None,  # route
        {},  # path_params
        environ,  # native
    )


WSGI_PROVIDES = Provides("the WSGI middleware", {"route": NO_ROUTER, "user": REMOTE_USER})
"""What key templates get here: no ``{route}`` ever, ``{user}`` only from ``REMOTE_USER``."""


class WSGIRateLimitMiddleware:
    """A WSGI app that rate-limits ``app`` by ``rules`` (see the module docstring).

    ``rules`` is a rules file path (reloaded when it changes), a ``RuleSet`` or a list of
    ``HttpRule`` / ``Rule``; ``store`` a store URL or object; every other keyword is an
    option of ``ratekeeper.web.core.RateLimitCore`` (``limiter=`` must be a ``Limiter``).
    Thread-safe: one instance serves every worker thread of its process.
    """

    def __init__(self, app: WSGIApp, rules: Any, store: Any = "memory://", **options: Any) -> None:
        self.app = app
        self.core = RateLimitCore(rules, store=store, provides=WSGI_PROVIDES, **options)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if self.core.metrics is not None:
            self.core.metrics.request("wsgi")
        view = request_view(environ)
        verdict = self.core.check(view)
        if not verdict.allowed:
            return self._deny(verdict, start_response)
        if verdict.exempt or not (verdict.headers or verdict.charges):
            return self.app(environ, start_response)
        extra = verdict.headers
        if not self.core.needs_finish(verdict):
            # Nothing to do after the response: only the headers are added.
            def add_headers(status: str, headers: list[tuple[str, str]], exc_info: ExcInfo | None = None) -> Any:
                return start_response(status, [*headers, *extra], exc_info)

            return self.app(environ, add_headers)
        record = self.core.response_record(verdict, view, environ)
        return self._call_finishing(environ, start_response, verdict, extra, record)

    def _call_finishing(
        self,
        environ: Environ,
        start_response: StartResponse,
        verdict: Verdict,
        extra: tuple[tuple[str, str], ...],
        record: ResponseRecord | None,
    ) -> Iterable[bytes]:
        """Call the app; give back what its final status calls for, and settle what the
        response cost (``response_cost``), when its body is closed."""
        seen: list[int] = []

        def start(status: str, headers: list[tuple[str, str]], exc_info: ExcInfo | None = None) -> Any:
            seen.append(_status_code(status))  # the last call wins: an error page replaces the first
            if record is not None:
                record.started(seen[-1], headers)
            return start_response(status, [*headers, *extra], exc_info)

        try:
            body = self.app(environ, start)
        except BaseException:
            self.core.finish(verdict, 500, record)
            raise
        return _Finishing(body, lambda: self.core.finish(verdict, seen[-1] if seen else 500, record))

    @staticmethod
    def _deny(verdict: Verdict, start_response: StartResponse) -> list[bytes]:
        phrase = _PHRASES.get(verdict.status, "Unknown")
        headers = [(k, v) for k, v in verdict.headers if k.lower() != "content-length"]
        headers.append(("Content-Length", str(len(verdict.body))))
        start_response(f"{verdict.status} {phrase}", headers)
        return [verdict.body]

    def close(self) -> None:
        """Close the limiter's store (WSGI has no shutdown hook: call it from yours)."""
        self.core.close()


_PHRASES = {int(status): status.phrase for status in HTTPStatus}
"""Each status's reason phrase (``HTTPStatus``'s, looked up without the enum's call)."""


def _status_code(status: str) -> int:
    try:
        return int(status.split(None, 1)[0])
    except (ValueError, IndexError):
        return 500


class _Finishing:
    """The app's body, chunk for chunk; ``close()`` closes it, then runs ``finish`` once.

    PEP 3333: the server calls ``close()`` when the response is done or abandoned, so a
    status that asks for a refund gives the charge back also when the client went away.
    """

    __slots__ = ("_body", "_finish")

    def __init__(self, body: Iterable[bytes], finish: Callable[[], None]) -> None:
        self._body = body
        self._finish: Callable[[], None] | None = finish

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        finish, self._finish = self._finish, None
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            if finish is not None:
                finish()
