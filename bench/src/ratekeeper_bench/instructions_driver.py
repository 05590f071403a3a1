"""Requests through ratekeeper's ASGI or WSGI middleware in this process, for callgrind to
count (``ratekeeper bench instructions`` runs it): ``python -m
ratekeeper_bench.instructions_driver CASE N``.

Every run first sends ``WARM`` requests (imports, caches, the store's first key), then
``N``; the command runs it with ``N`` and with 0 and divides the difference by ``N``, so
start-up and warm-up cancel out. The store is ``memory://``, the rule the web benchmark's
(one ``{client_ip}`` rule, GCRA, headers on), the app a raw ASGI/WSGI callable answering
``ok``: what is counted is the middleware and the limiter, plus the driver's own loop,
which the ``*_bare`` cases measure alone. The ``django_*`` cases send the same WSGI
requests to Django's WSGI handler (settings made in this process: one URL, one view
answering ``ok``, no middleware but ratekeeper's ``RateLimitMiddleware`` in
``django_one`` and ``django_429``), so less ``django_bare`` is what the Django
middleware adds to a Django request.
"""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from ratekeeper import Rule
from ratekeeper.config import HttpRule, KeyTemplate
from ratekeeper.config.model import Match, PathTemplate
from ratekeeper.web.asgi import ASGIApp, Message, Scope

WARM = 50

CASES = {
    "asgi_bare": "the raw ASGI app alone (the driver's floor)",
    "asgi_one": "ASGI middleware, one rule, admitted, headers on",
    "asgi_pass": "ASGI middleware, no rule matches the path (passed through)",
    "asgi_429": "ASGI middleware, one rule, refused (429)",
    "wsgi_bare": "the raw WSGI app alone (the driver's floor)",
    "wsgi_one": "WSGI middleware, one rule, admitted, headers on",
    "wsgi_429": "WSGI middleware, one rule, refused (429)",
    "django_bare": "Django's WSGI app alone, one view answering ok, no middleware (the driver's floor)",
    "django_one": "Django middleware, one rule, admitted, headers on",
    "django_429": "Django middleware, one rule, refused (429)",
}
"""Each case: what it measures."""

ADMITS = "1000000/1s"
REFUSES = "1/3600s"  # spent by the warm-up: every counted request is refused


HEADERS = [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"wrk"), (b"accept", b"*/*")]


def _rules(limit: str, path: str | None = None) -> list[HttpRule]:
    match = Match() if path is None else Match(paths=(PathTemplate.parse(path),))
    return [HttpRule(Rule("bench", [limit]), match=match, key=KeyTemplate.parse("{client_ip}"))]


async def _app(
    scope: Scope, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]
) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send(message: Message) -> None:
    return None


async def _asgi(app: ASGIApp, total: int) -> None:
    for _ in range(total):
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/bench",
            "raw_path": b"/bench",
            "query_string": b"",
            "root_path": "",
            "headers": list(HEADERS),
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
        }
        await app(scope, _receive, _send)


def _wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def _start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
    return None


def _wsgi(app: Callable[..., Iterable[bytes]], total: int, body_in: io.BytesIO | None = None) -> None:
    """``total`` requests; ``body_in``: the ``wsgi.input`` Django reads (an empty body, never
    read: no ``CONTENT_LENGTH``)."""
    for _ in range(total):
        environ: dict[str, Any] = {
            "REQUEST_METHOD": "GET",
            "SCRIPT_NAME": "",
            "PATH_INFO": "/bench",
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "HTTP_HOST": "127.0.0.1:8000",
            "HTTP_USER_AGENT": "wrk",
            "HTTP_ACCEPT": "*/*",
            "wsgi.url_scheme": "http",
        }
        if body_in is not None:
            environ["wsgi.input"] = body_in
        body = app(environ, _start_response)
        for _chunk in body:
            pass
        close = getattr(body, "close", None)
        if close is not None:
            close()


urlpatterns: list[Any] = []
"""The ``django_*`` cases' URLconf (this module is their ``ROOT_URLCONF``)."""


def _ok(request: Any) -> Any:
    from django.http import HttpResponse  # type: ignore[import-untyped,unused-ignore]

    return HttpResponse("ok", content_type="text/plain")


def _django(case: str) -> Callable[..., Iterable[bytes]]:
    """Django's WSGI app for a ``django_*`` case, configured in this process."""
    from django.conf import settings  # type: ignore[import-untyped,unused-ignore]
    from django.urls import path  # type: ignore[import-untyped,unused-ignore]

    extra: dict[str, Any] = {}
    middleware: list[str] = []
    if case != "django_bare":
        middleware.append("ratekeeper.web.django.RateLimitMiddleware")
        extra["RATEKEEPER"] = {"rules": _rules(REFUSES if case == "django_429" else ADMITS), "store": "memory://"}
    settings.configure(
        DEBUG=False,
        SECRET_KEY="ratekeeper-bench-instructions",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        MIDDLEWARE=middleware,
        INSTALLED_APPS=[],
        USE_TZ=True,
        **extra,
    )
    urlpatterns.append(path("bench", _ok))
    from django.core.wsgi import get_wsgi_application  # type: ignore[import-untyped,unused-ignore]

    app: Callable[..., Iterable[bytes]] = get_wsgi_application()
    return app


def _check_django(case: str, app: Callable[..., Iterable[bytes]]) -> None:
    """One request after the warm-up (in both runs, so it cancels out): the case answers as
    it says, else counting it would measure an error page."""
    answered: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        answered.append((status, headers))

    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/bench",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1:8000",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(b""),
    }
    b"".join(app(environ, start_response))
    status, headers = answered[0]
    expected = "429" if case == "django_429" else "200"
    limited = any(name == "RateLimit" for name, _ in headers)
    if not status.startswith(expected) or limited != (case != "django_bare"):
        raise SystemExit(f"{case}: answered {status} {headers}; expected {expected}, rate-limit headers if limited")


def run(case: str, n: int) -> None:
    """Send ``WARM`` then ``n`` requests of ``case``."""
    if case not in CASES:
        raise SystemExit(f"unknown case {case!r}; one of {', '.join(CASES)}")
    if case.startswith("asgi"):
        from ratekeeper.web import RateLimitMiddleware

        app: ASGIApp = _app
        if case != "asgi_bare":
            rules = (
                _rules(ADMITS, "/other") if case == "asgi_pass" else _rules(REFUSES if case == "asgi_429" else ADMITS)
            )
            app = RateLimitMiddleware(_app, rules=rules, store="memory://")

        async def main() -> None:
            await _asgi(app, WARM)
            await _asgi(app, n)

        asyncio.run(main())
        return
    if case.startswith("django"):
        django = _django(case)
        body_in = io.BytesIO(b"")
        _wsgi(django, WARM, body_in)
        _check_django(case, django)
        _wsgi(django, n, body_in)
        return
    from ratekeeper.web import WSGIRateLimitMiddleware

    wsgi: Callable[..., Iterable[bytes]] = _wsgi_app
    if case != "wsgi_bare":
        wsgi = WSGIRateLimitMiddleware(
            _wsgi_app, rules=_rules(REFUSES if case == "wsgi_429" else ADMITS), store="memory://"
        )
    _wsgi(wsgi, WARM)
    _wsgi(wsgi, n)


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]))
