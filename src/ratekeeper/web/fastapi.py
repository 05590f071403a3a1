"""FastAPI: per-endpoint rules as a dependency (``Depends(RateLimit(...))``) or a decorator.

::

    from ratekeeper import Rule
    from ratekeeper.web.fastapi import RateLimit, limit

    per_partner = RateLimit(Rule("items.list", "1/3s"), key="{path.user}", store="postgresql://...")

    @app.get("/items/{user}", dependencies=[Depends(per_partner)])
    async def items(user: str): ...

    @app.post("/auth/token")
    @limit(Rule("auth.create_token", ["20/minute", "5/3s"]), key="{client_ip}")
    async def token(): ...

    @limit("5/minute", key=lambda request: request.headers.get("x-api-key"))
    @app.get("/search")  # the decorator works above the route decorator too
    async def search(q: str): ...

The same core as the middleware (``ratekeeper.web.base``; every option of it is taken
here): a refusal raises ``RateLimited`` (an ``HTTPException``) answered with the same 429
as the middleware's (problem+json body, ``Retry-After``, the rate-limit headers); an
admission adds the rate-limit headers to the endpoint's response. A bare ``Rule`` is
keyed by ``key`` (a template, default ``"{client_ip}"``, or ``callable(request) -> str |
None``; None skips the rule for that request); its ``match`` is the endpoint itself.
``refund_statuses`` sees the status of an ``HTTPException`` the endpoint raises (500 for
any other exception) or the status set on the injected ``Response``; the status of a
``Response`` object the endpoint returns is not visible to a dependency.

Under ``RateLimitMiddleware`` too, the route answers one set of rate-limit headers (the
middleware writes them, for its rules and the dependency's: the tightest limit in
``X-RateLimit-*``); when the dependency refuses, what the middleware charged for the
request is given back, so a refusal charges nothing anywhere (``web.base.RequestLedger``).
Several dependencies of one route: a refusal by a later one gives back what the earlier
ones charged (the headers of an admitted request are the first dependency's).

``response_cost`` (``ratekeeper.web.base``) is settled when FastAPI exits the dependency,
after the response was sent (its streamed body included): from the headers set on the
injected ``Response`` (an endpoint that returns its own ``Response`` object: only under the
decorator above the route decorator, which sees the response itself), else from what the
endpoint added to ``ratekeeper.web.usage(request)``.

Known limit: FastAPI adds a dependency's headers only to responses it builds from a
returned value; an endpoint that returns its own ``Response`` object gets none (under the
middleware it gets the middleware's, which include the dependency's rules).
"""

# No ``from __future__ import annotations``: FastAPI reads the dependency's annotations
# (Request, Response) at runtime from the signature.

import contextlib
import functools
import gc
import inspect
import os
import typing
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any

from fastapi import Depends, HTTPException, Request, Response
from starlette.responses import Response as StarletteResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ratekeeper.config.model import HttpRule, KeyTemplate, RuleSet
from ratekeeper.errors import InvalidLimit
from ratekeeper.limit import Limit
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.rule import Rule
from ratekeeper.web.asgi import check_scope_user, request_view, run_shielded
from ratekeeper.web.base import LEDGER, RequestLedger
from ratekeeper.web.core_async import AsyncRateLimitCore
from ratekeeper.web.keyable import Provides
from ratekeeper.web.request import RequestView, Verdict

__all__ = ["RateLimit", "RateLimited", "install", "limit", "rate_limited_response"]

DEFAULT_KEY = "{client_ip}"
_RULES_FILE_SUFFIXES = (".yaml", ".yml", ".json", ".toml")


class RateLimited(HTTPException):
    """A refused request: status, headers and body are the core's 429 (``verdict``)."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(status_code=verdict.status, detail=verdict.body.decode(), headers=dict(verdict.headers))
        self.verdict = verdict


def rate_limited_response(request: Request, exc: Exception) -> StarletteResponse:
    """The exception handler of ``RateLimited``: the verdict's status, headers and body as is."""
    assert isinstance(exc, RateLimited)
    verdict = exc.verdict
    return StarletteResponse(verdict.body, status_code=verdict.status, headers=dict(verdict.headers))


def install(app: Any) -> None:
    """Register the handler of ``RateLimited`` on ``app`` (optional: the dependency also
    registers it for each request that it refuses)."""
    app.add_exception_handler(RateLimited, rate_limited_response)


def _http_rules(
    rules: Any, key: str | Callable[[Request], str | None] | None
) -> RuleSet | list[HttpRule | Mapping[str, Any]]:
    if isinstance(rules, RuleSet | str):
        return rules  # type: ignore[return-value]
    items = [rules] if isinstance(rules, Rule | HttpRule | Mapping) else list(rules)  # a Mapping: one file entry
    template = KeyTemplate.parse(key if isinstance(key, str) else DEFAULT_KEY)
    return [HttpRule(item, key=template) if isinstance(item, Rule) else item for item in items]


FASTAPI_PROVIDES = Provides("the FastAPI dependency")
"""As the ASGI middleware: the route is known; ``{user}`` looked for in the first request's scope."""


class RateLimit:
    """A dependency that charges ``rules`` for each request of the endpoints using it.

    ``rules``: a ``Rule``, an ``HttpRule``, a rules file's entry as a dict (``{"name":
    "search", "limits": ["5/minute"]}``, keyed by its own ``key``, as in a file), a list of
    them, a ``RuleSet`` or a rules-file path. ``key`` and ``cost`` as in the module
    docstring and ``AsyncRateLimitCore`` (``cost``: an int, a template such as
    ``"{header.x-cost}"``, or ``callable(request) -> int``).
    Share one ``AsyncLimiter`` (``limiter=``) between many dependencies to share a store
    connection pool.
    """

    def __init__(
        self,
        rules: Any,
        *,
        key: str | Callable[[Request], str | None] | None = None,
        cost: Any = None,
        store: Any = "memory://",
        limiter: AsyncLimiter | None = None,
        **options: Any,
    ) -> None:
        if callable(key):
            key_fn = key
            options["key"] = lambda view, rule: key_fn(view.native)
        if callable(cost) and not isinstance(cost, KeyTemplate):
            cost_fn = cost
            options["cost"] = lambda view, rule: cost_fn(view.native)
        elif cost is not None:
            options["cost"] = cost
        self.core = AsyncRateLimitCore(
            _http_rules(rules, key), store=store, limiter=limiter, provides=FASTAPI_PROVIDES, **options
        )

    async def __call__(self, request: Request, response: Response) -> AsyncIterator[Verdict]:
        if not self.core.scope_checked:
            check_scope_user(self.core, request.scope)
        if self.core.metrics is not None:
            self.core.metrics.request("fastapi")
        view = self.view(request)
        verdict = await self.core.check(view)
        ledger: RequestLedger | None = request.scope.get(LEDGER)
        if not verdict.allowed:
            if ledger is not None:  # what the middleware (or another dependency) charged is given back
                await ledger.refuse()
            _register_handler(request)
            raise RateLimited(verdict)
        if ledger is not None:
            # the outermost check (the middleware) writes one set of headers for every rule
            ledger.admitted.append((self.core, verdict))
        else:
            ledger = request.scope[LEDGER] = RequestLedger([(self.core, verdict)])
            for name, value in verdict.headers:
                response.headers.append(name, value)
        status = 500
        record = self.core.response_record(verdict, view, request.scope)
        try:
            yield verdict
            status = response.status_code or 200
        except HTTPException as exc:
            status = exc.status_code
            raise
        except OSError:  # the client went away mid-stream (Starlette's ClientDisconnect): it was answered
            status = response.status_code or 200
            raise
        finally:
            # a refusal further in gave this verdict's charges back already
            if verdict.charges and not ledger.refused:
                if record is not None:
                    # FastAPI exits the dependency after the response was sent (its body
                    # streamed); the headers it sees are those of the injected Response
                    record.started(status, response.headers.items())
                if record is None:
                    await self.core.finish(verdict, status, record)
                else:  # to its end, also when the request's task is cancelled meanwhile
                    await run_shielded(self.core.finish(verdict, status, record))

    def view(self, request: Request) -> RequestView:
        """The core's view of ``request`` (what the key and cost callables see as ``native``)."""
        view = request_view(request.scope)
        view.native = request
        return view


def _register_handler(request: Request) -> None:
    # Starlette's exception middleware puts its handler tables in the scope for the routing
    # layer; adding ours there (once) makes the refusal the core's 429 without asking the
    # user to call install(app). Without that key (another framework) the HTTPException
    # still carries the status and headers, with the body as its detail.
    handlers = request.scope.get("starlette.exception_handlers")
    if handlers and isinstance(handlers[0], dict):
        handlers[0].setdefault(RateLimited, rate_limited_response)


def limit(rules: Any, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator for one endpoint: ``@limit("5/minute", key=lambda request: ...)``.

    ``rules``: as ``RateLimit``'s, or limit strings (``"5/minute"``, ``"20/minute;5/3s"``
    or a list of them) that make a rule named for the endpoint (``module.function``);
    ``key`` defaults to the client address, resolved as the middleware resolves it.

    Below the route decorator, it adds ``Depends(RateLimit(rules, **options))`` to the
    endpoint. Above it, the route already holds the undecorated function, so the decorator
    finds each route whose endpoint that function is (FastAPI's and Starlette's) and wraps
    the route's ASGI app with the same check; a route copied later by ``include_router``
    gets the dependency through the route's ``dependencies``.
    """
    limits = _limit_strings(rules)
    shared = None if limits is not None else RateLimit(rules, **options)

    def decorate(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        if shared is not None:
            dependency = shared
        else:
            assert limits is not None
            name = f"{endpoint.__module__}.{endpoint.__qualname__}".replace(".<locals>", "")
            dependency = RateLimit(Rule(name, limits), **options)
        routes = _routes_of(endpoint)
        for route in routes:
            route.app = _checked_route_app(dependency, route.app)
            dependencies = getattr(route, "dependencies", None)
            if isinstance(dependencies, list):
                dependencies.append(Depends(dependency))
        if routes:
            endpoint.__ratekeeper__ = dependency  # type: ignore[attr-defined]
            return endpoint
        return _with_dependency(endpoint, dependency)

    return decorate


def _limit_strings(rules: Any) -> list[str] | None:
    """The limit strings in ``rules`` (``"5/minute"``, ``"20/minute;5/3s"``, a list of
    them), or None when ``rules`` is something else (a rule, a rule set, a rules file)."""
    if isinstance(rules, str):
        items = [part.strip() for part in rules.split(";") if part.strip()]
    elif isinstance(rules, list | tuple) and rules and all(isinstance(item, str) for item in rules):
        items = list(rules)
    else:
        return None
    try:
        for item in items:
            Limit.parse(item)
    except InvalidLimit:
        if isinstance(rules, str) and (os.path.exists(rules) or rules.lower().endswith(_RULES_FILE_SUFFIXES)):
            return None  # a rules-file path
        raise
    return items or None


def _routes_of(endpoint: Callable[..., Any]) -> list[Route]:
    """The routes already registered with ``endpoint`` (the decorator sits above the route
    decorator). A route refers to its endpoint from its attributes, which the garbage
    collector sees as the route itself or as the route's ``__dict__``."""
    found: list[Route] = []
    for referrer in gc.get_referrers(endpoint):
        if isinstance(referrer, BaseRoute):
            candidates: list[Any] = [referrer]
        elif isinstance(referrer, dict) and referrer.get("endpoint") is endpoint:
            candidates = [r for r in gc.get_referrers(referrer) if isinstance(r, BaseRoute)]
        else:
            continue
        for route in candidates:
            if isinstance(route, Route) and route.endpoint is endpoint and route not in found:
                found.append(route)
    return found


def _checked_route_app(dependency: RateLimit, app: ASGIApp) -> ASGIApp:
    """``app`` (a route's ASGI app) behind ``dependency``'s check, run as FastAPI runs the
    dependency: the 429 on a refusal; on an admission the headers are added to the
    response and the charge is finished with the response's status."""

    async def checked(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        response = Response()
        del response.headers["content-length"]  # as FastAPI's own sub-response: only the check's headers
        check = typing.cast(AsyncGenerator[Verdict, None], dependency(request, response))
        try:
            await check.__anext__()
        except RateLimited as exc:
            await rate_limited_response(request, exc)(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                response.status_code = message["status"]
                message = {**message, "headers": [*message.get("headers", []), *response.headers.raw]}
                await send(message)
                # sent: from now on the check's Response holds the route's own headers, for
                # response_cost to read when the check finishes
                response.headers.raw[:] = list(message["headers"])
                return
            await send(message)

        try:
            await app(scope, receive, send_with_headers)
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                await check.athrow(exc)
            raise
        with contextlib.suppress(StopAsyncIteration):
            await check.__anext__()

    return checked


def _with_dependency(endpoint: Callable[..., Any], dependency: RateLimit) -> Callable[..., Any]:
    """``endpoint`` with ``Depends(dependency)`` as an extra keyword-only parameter."""
    signature = inspect.signature(endpoint)
    hints = typing.get_type_hints(endpoint, include_extras=True)
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()]
    extra = inspect.Parameter(
        "_ratekeeper_verdict", inspect.Parameter.KEYWORD_ONLY, default=Depends(dependency), annotation=Any
    )
    last = len(params) if not params or params[-1].kind != inspect.Parameter.VAR_KEYWORD else len(params) - 1
    params.insert(last, extra)
    new_signature = signature.replace(
        parameters=params, return_annotation=hints.get("return", signature.return_annotation)
    )

    if inspect.iscoroutinefunction(endpoint):

        @functools.wraps(endpoint)
        async def async_wrapper(*args: Any, _ratekeeper_verdict: Any = None, **kwargs: Any) -> Any:
            return await endpoint(*args, **kwargs)

        wrapper: Callable[..., Any] = async_wrapper
    else:

        @functools.wraps(endpoint)
        def sync_wrapper(*args: Any, _ratekeeper_verdict: Any = None, **kwargs: Any) -> Any:
            return endpoint(*args, **kwargs)

        wrapper = sync_wrapper
    wrapper.__signature__ = new_signature  # type: ignore[attr-defined]
    wrapper.__ratekeeper__ = dependency  # type: ignore[attr-defined]
    return wrapper
