"""``RateLimitMiddleware``: the ASGI middleware (Starlette, FastAPI, any ASGI app).

A plain ASGI callable, not Starlette's ``BaseHTTPMiddleware``: it never reads or buffers a
body. An HTTP request is decided before the app sees it; a refused one is answered here
(the 429 of ``AsyncRateLimitCore``) and never reaches the app; an admitted one goes through
with ``send`` wrapped only to add the rate-limit headers to ``http.response.start`` and to
learn the status, so streaming responses stream. Websockets and lifespan pass through
untouched (lifespan's shutdown also closes the limiter's store). With ``response_cost``
(``ratekeeper.web.settle``) the response is settled right after its last body message (or
its trailers), else when the app returns, raises or is cancelled.

Path parameters come from the rules' own path templates; when a rule needs one its
template lacks, or ``{route}``, the app's routes are asked (``scope["route"]`` when the
framework set it, else a Starlette-style ``app.routes`` match), only then. ``{user}`` is
Starlette's ``scope["user"]`` (its ``AuthenticationMiddleware``, placed before this one)
unless a ``user=`` callable says otherwise; when the first request's scope has no
``"user"``, each rule whose key needs it is warned once (``ratekeeper.web.keyable``).

A configuration that cannot be used (a rules file that fails to load, a bad option) is
not raised from the constructor: Starlette and FastAPI build their middleware when the
first event arrives, and an error there is taken by uvicorn's default lifespan handling
for "lifespan not supported", after which the app serves a 500 for every request. It is
kept and answered to ``lifespan.startup`` with ``lifespan.startup.failed``, so the server
refuses to start and says why; a server run without lifespan gets the error raised on
every request instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, MutableMapping
from typing import Any, Unpack

from ratekeeper.errors import ConfigurationError
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.web.base import LEDGER, CoreOptions, RequestLedger
from ratekeeper.web.core_async import AsyncRateLimitCore
from ratekeeper.web.keyable import NO_SCOPE_USER, Provides
from ratekeeper.web.request import LazyHeaders, RequestView, Verdict
from ratekeeper.web.settle import ResponseRecord

__all__ = ["RateLimitMiddleware", "check_scope_user", "request_view", "run_shielded", "send_verdict"]

log = logging.getLogger("ratekeeper.web")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


ASGI_PROVIDES = Provides("the ASGI middleware")
"""Every part at start: ``{route}`` from the app's routes; ``{user}`` is looked for in the
first request's scope (``NO_SCOPE_USER`` when it has none)."""


class RateLimitMiddleware:
    """Rate limits an ASGI app with the rules ``rules`` (see ``ratekeeper.web.base`` for
    every option); ``app.add_middleware(RateLimitMiddleware, rules="rules.yaml",
    store="redis://cache:6379/0")``."""

    def __init__(
        self, app: ASGIApp, *, rules: Any, limiter: AsyncLimiter | None = None, **options: Unpack[CoreOptions]
    ) -> None:
        # The options are typed (``CoreOptions``), not ``**options: Any``, so that type checkers
        # check ``app.add_middleware(RateLimitMiddleware, rules=..., store=...)``.
        self.app = app
        self.startup_error: Exception | None = None
        try:
            self._core: AsyncRateLimitCore | None = AsyncRateLimitCore(
                rules, limiter=limiter, provides=ASGI_PROVIDES, **options
            )
        except (ConfigurationError, OSError) as exc:
            self._core = None
            self.startup_error = exc

    @property
    def core(self) -> AsyncRateLimitCore:
        """The core deciding requests; the configuration's error when there is none."""
        if self._core is None:
            assert self.startup_error is not None
            raise self.startup_error
        return self._core

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            if self.startup_error is not None:
                await _fail_startup(receive, send, self.startup_error)
                return
            await self.app(scope, receive, self._lifespan_send(send))
            return
        if kind != "http":
            await self.app(scope, receive, send)
            return
        core = self._core
        if core is None:
            core = self.core  # raises the configuration's error
        if not core.scope_checked:
            check_scope_user(core, scope)
        if core.metrics is not None:
            core.metrics.request("asgi")
        outer: RequestLedger | None = scope.get(LEDGER)
        view = request_view(scope)
        verdict = await core.check(view)
        if not verdict.allowed:
            if outer is not None:  # a middleware further out admitted it: give that back too
                await outer.refuse()
            await send_verdict(send, verdict)
            return
        # The checks further in (a FastAPI dependency, another middleware) see this one's
        # verdict, so the response has one set of headers and a refusal charges nothing.
        if outer is None:
            ledger = scope[LEDGER] = RequestLedger([(core, verdict)])
        else:
            ledger = outer
            ledger.admitted.append((core, verdict))
        finish = core.needs_finish(verdict)
        if not finish:
            if outer is not None:
                # the outermost check writes the headers, and this one has nothing to give back:
                # the response need not be watched
                await self.app(scope, receive, send)
                return
            # Nothing to give back or settle: ``send`` is wrapped only to add the headers.
            await self.app(scope, receive, _headers_adder(send, core, verdict, ledger))
            return
        status = 500  # what the app answered; an app that raised before answering counts as a 500
        record = core.response_record(verdict, view, scope)

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
                if record is not None:
                    record.started(status, message.get("headers", ()))
                    record.expects_trailers = bool(message.get("trailers", False))
                # the outermost check writes the headers, of every check that admitted the request
                if outer is None and not ledger.refused:
                    message = _with_headers(message, core, verdict, ledger)
                await send(message)
                return
            if record is not None and kind == "http.response.trailers":
                record.trailed(message.get("headers", ()))
            await send(message)
            if record is not None and _ends(message, record.expects_trailers) and not ledger.refused:
                # The response ended: settled now, not when the app returns (it may go on
                # working). In a task of its own: Starlette cancels its streaming task as soon
                # as the server reports the finished response, which may be right now.
                await run_shielded(core.finish(verdict, status, record))

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            # a refusal further in gave this verdict's charges back already; a record
            # settled at the end of the body is not settled again (``claim``)
            if not ledger.refused:
                await _finish_shielded(core, verdict, status, record)

    def _lifespan_send(self, send: Send) -> Send:
        async def lifespan_send(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await settle_pending()  # settlements still running are written before the store closes
                await self.core.aclose()
            await send(message)

        return lifespan_send


def check_scope_user(core: AsyncRateLimitCore, scope: Scope) -> None:
    """At ``core``'s first request (``core.scope_checked`` is then set): when the ASGI scope
    has no ``"user"`` (no authentication middleware before this one), warn once for each
    rule whose key needs ``{user}``."""
    core.scope_checked = True
    if "user" not in scope:
        core.part_missing("user", NO_SCOPE_USER)


def _headers_adder(send: Send, core: AsyncRateLimitCore, verdict: Verdict, ledger: RequestLedger) -> Send:
    """``send`` adding the rate-limit headers of the request's checks (``ledger``, of which
    this middleware's is the outermost) to the response's start: the wrapper of a response
    that nothing is given back or settled for, most of them."""

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start" and not ledger.refused:
            message = _with_headers(message, core, verdict, ledger)
        await send(message)

    return send_with_headers


def _with_headers(message: Message, core: AsyncRateLimitCore, verdict: Verdict, ledger: RequestLedger) -> Message:
    """The ``http.response.start`` ``message`` with the rate-limit headers of every check
    that admitted the request (a copy: the app's message is left as it is)."""
    fields = verdict.headers if len(ledger.admitted) == 1 else core.headers_for(ledger.verdicts())
    if not fields:
        return message
    headers = list(message.get("headers", ()))
    headers += encoded(fields)
    return {**message, "headers": headers}


def _ends(message: Message, trailers: bool) -> bool:
    """Whether ``message`` is the last of a response: its last body part (unless trailers
    follow) or its last trailers."""
    kind = message["type"]
    if kind == "http.response.body":
        return not trailers and not message.get("more_body", False)
    return kind == "http.response.trailers" and not message.get("more_trailers", False)


async def _finish_shielded(
    core: AsyncRateLimitCore, verdict: Verdict, status: int, record: ResponseRecord | None
) -> None:
    """``core.finish``, run to its end also when the request's task is being cancelled (the
    client went away mid-stream): what the app streamed so far is settled, leases released.
    A task of its own only when it may be cancelled: a settlement, or a cancelled caller."""
    if record is not None and record.claimed:
        return  # settled at the end of the body: nothing is left to do
    current = asyncio.current_task()
    if record is None and (current is None or not current.cancelling()):
        await core.finish(verdict, status, record)
        return
    await run_shielded(core.finish(verdict, status, record))


async def run_shielded(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end in a task of its own, even when the caller is cancelled
    meanwhile (the caller's ``CancelledError`` is raised, ``work`` goes on)."""
    task = asyncio.ensure_future(work)
    _FINISHING.add(task)  # the loop keeps only a weak reference to a task
    task.add_done_callback(_finished)
    await asyncio.shield(task)


_FINISHING: set[asyncio.Future[None]] = set()

SHUTDOWN_SETTLE_SECONDS = 10.0
"""How long the app's shutdown waits for the settlements still running."""


async def settle_pending(timeout: float = SHUTDOWN_SETTLE_SECONDS) -> None:
    """Wait for the settlements and lease releases of this event loop still running (a
    response that ended just before the server stopped), at most ``timeout`` seconds: the
    store is closed next, and what they had to write would be lost."""
    loop = asyncio.get_running_loop()
    pending = [task for task in _FINISHING if task.get_loop() is loop]
    if not pending:
        return
    _done, late = await asyncio.wait(pending, timeout=timeout)
    if late:
        log.warning("ratekeeper: %d settlements still running at shutdown were not awaited", len(late))


def _finished(task: asyncio.Future[None]) -> None:
    _FINISHING.discard(task)
    if not task.cancelled() and task.exception() is not None:  # retrieved: its caller may be gone
        log.warning("ratekeeper: finishing a request after its response failed", exc_info=task.exception())


async def _fail_startup(receive: Receive, send: Send, error: Exception) -> None:
    """Answer the server's ``lifespan.startup`` with ``lifespan.startup.failed``: the app
    cannot limit anything, and serving it unlimited (or as 500s) would hide that."""
    message = await receive()
    if message["type"] == "lifespan.startup":
        text = f"ratekeeper RateLimitMiddleware cannot start: {error}"
        await send({"type": "lifespan.startup.failed", "message": text})


async def send_verdict(send: Send, verdict: Verdict) -> None:
    """Answer with a refusing verdict's status, headers and body."""
    headers = encoded(verdict.headers)
    headers.append((b"content-length", str(len(verdict.body)).encode()))
    await send({"type": "http.response.start", "status": verdict.status, "headers": headers})
    await send({"type": "http.response.body", "body": verdict.body})


_NAMES: dict[str, bytes] = {}
"""Header names as ASGI sends them (lower-case bytes), each encoded once: a response's
rate-limit fields repeat the same five names."""


def encoded(fields: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """``fields`` as ASGI header pairs."""
    names = _NAMES
    return [(names.get(name) or _encoded_name(name), value.encode("latin-1")) for name, value in fields]


def _encoded_name(name: str) -> bytes:
    raw = name.lower().encode("latin-1")
    if len(_NAMES) < 256:  # names come from the code and the deny_response option: a few
        _NAMES[name] = raw
    return raw


def request_view(scope: Scope) -> RequestView:
    """The core's view of an ASGI HTTP request."""
    raw = scope.get("headers", ())
    headers = AsgiHeaders(raw)
    client = scope.get("client")
    host = headers.find(b"host")
    if host is None and scope.get("server"):
        host = str(scope["server"][0])
    query = scope.get("query_string", b"")
    parts = _ScopeParts(scope)
    # positional: the fields in ``RequestView``'s order (cheaper to pass than keywords)
    return RequestView(
        scope.get("method", "GET"),  # method
        scope.get("path", "/"),  # path
        host,
        headers,
        query.decode("latin-1") if query else "",  # query_string
        str(client[0]) if client else None,  # peer
        parts.user,  # user
        parts.route,  # route
        parts.path_params,  # path_params
        scope,  # native
    )


class AsgiHeaders(LazyHeaders):
    """An ASGI scope's headers as the core reads them (lower-case names, repeated fields
    joined with ``", "``), decoded only when asked: a request's rules read a header or
    two, and decoding every header cost more than deciding."""

    __slots__ = ("_all", "raw")

    def __init__(self, raw: Iterable[tuple[bytes, bytes]]) -> None:
        self.raw = raw
        self._all: dict[str, str] | None = None

    def get(self, name: str, default: Any = None) -> Any:
        if self._all is not None:
            return self._all.get(name, default)
        found = self.find(name.encode("latin-1"))
        return default if found is None else found

    def find(self, wanted: bytes) -> str | None:
        """The value of the field named ``wanted`` (lower-case bytes), None when absent."""
        if self._all is not None:
            return self._all.get(wanted.decode("latin-1"))
        found: str | None = None
        size = len(wanted)
        for raw_name, raw_value in self.raw:
            # servers send lower-case names (ASGI asks them to): lowered only when it may match
            if raw_name == wanted or (len(raw_name) == size and raw_name.lower() == wanted):
                value = raw_value.decode("latin-1")
                found = value if found is None else f"{found}, {value}"
        return found

    def every(self) -> dict[str, str]:
        if self._all is None:
            headers: dict[str, str] = {}
            for raw_name, raw_value in self.raw:
                name = raw_name.decode("latin-1").lower()
                value = raw_value.decode("latin-1")
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
            self._all = headers
        return self._all


def scope_user(scope: Scope) -> str | None:
    """The id of Starlette's authenticated ``scope["user"]`` (``identity``, else ``display_name``)."""
    user = scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    for attribute in ("identity", "display_name", "username"):
        try:
            value = getattr(user, attribute, None)
        except NotImplementedError:  # Starlette's BaseUser raises for what it does not define
            continue
        if value:
            return str(value)
    return None


class _ScopeParts:
    """The user, route template and path parameters of a request, each found in its scope
    when first needed (the route and parameters once, together)."""

    __slots__ = ("_found", "scope")

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self._found: tuple[str | None, Mapping[str, str]] | None = None

    def _find(self) -> tuple[str | None, Mapping[str, str]]:
        if self._found is None:
            route = self.scope.get("route")
            if route is not None and getattr(route, "path", None):
                params = self.scope.get("path_params") or {}
                self._found = (str(route.path), {k: str(v) for k, v in params.items()})
            else:
                app = self.scope.get("app")
                self._found = _match_routes(getattr(app, "routes", None), self.scope, "")
        return self._found

    def user(self) -> str | None:
        return scope_user(self.scope)

    def route(self) -> str | None:
        return self._find()[0]

    def path_params(self) -> Mapping[str, str]:
        return self._find()[1]


def _match_routes(routes: Iterable[Any] | None, scope: Scope, prefix: str) -> tuple[str | None, Mapping[str, str]]:
    """The first route of ``routes`` that fully matches (Starlette's ``Route.matches``)."""
    for route in routes or ():
        matches = getattr(route, "matches", None)
        if matches is None:
            continue
        try:
            match, child = matches(scope)
        except Exception:  # noqa: BLE001 - a route that cannot judge this scope does not match it
            continue
        if getattr(match, "name", "") != "FULL":
            continue
        path = prefix + str(getattr(route, "path", ""))
        params = {k: str(v) for k, v in (child.get("path_params") or {}).items()}
        inner = getattr(route, "routes", None)
        if inner:  # a Mount: its routes see the rest of the path
            sub_route, sub_params = _match_routes(inner, {**scope, **child}, path)
            return sub_route or path, {**params, **sub_params}
        return path, params
    return None, {}
