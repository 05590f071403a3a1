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

Known limit: FastAPI adds a dependency's headers only to responses it builds from a
returned value; an endpoint that returns its own ``Response`` object gets none (under the
middleware it gets the middleware's, which include the dependency's rules).
"""

# No ``from __future__ import annotations``: FastAPI reads the dependency's annotations
# (Request, Response) at runtime from the signature.

import functools
import inspect
import typing
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Depends, HTTPException, Request, Response
from starlette.responses import Response as StarletteResponse

from ratekeeper.config.model import HttpRule, KeyTemplate, RuleSet
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.rule import Rule
from ratekeeper.web.asgi import request_view
from ratekeeper.web.base import LEDGER, RequestLedger
from ratekeeper.web.core_async import AsyncRateLimitCore
from ratekeeper.web.request import RequestView, Verdict

__all__ = ["RateLimit", "RateLimited", "install", "limit", "rate_limited_response"]

DEFAULT_KEY = "{client_ip}"


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


def _http_rules(rules: Any, key: str | Callable[[Request], str | None] | None) -> RuleSet | list[HttpRule]:
    if isinstance(rules, RuleSet | str):
        return rules  # type: ignore[return-value]
    items = [rules] if isinstance(rules, Rule | HttpRule) else list(rules)
    template = KeyTemplate.parse(key if isinstance(key, str) else DEFAULT_KEY)
    return [HttpRule(item, key=template) if isinstance(item, Rule) else item for item in items]


class RateLimit:
    """A dependency that charges ``rules`` for each request of the endpoints using it.

    ``rules``: a ``Rule``, an ``HttpRule``, a list of them, a ``RuleSet`` or a rules-file
    path. ``key`` and ``cost`` as in the module docstring and ``AsyncRateLimitCore`` (``cost``:
    an int, a template such as ``"{header.x-cost}"``, or ``callable(request) -> int``).
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
        self.core = AsyncRateLimitCore(_http_rules(rules, key), store=store, limiter=limiter, **options)

    async def __call__(self, request: Request, response: Response) -> AsyncIterator[Verdict]:
        if self.core.metrics is not None:
            self.core.metrics.request("fastapi")
        verdict = await self.core.check(self.view(request))
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
        try:
            yield verdict
            status = response.status_code or 200
        except HTTPException as exc:
            status = exc.status_code
            raise
        finally:
            # a refusal further in gave this verdict's charges back already
            if verdict.charges and not ledger.refused:
                await self.core.finish(verdict, status)

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
    """A decorator for one endpoint: ``@limit(rule, key=..., cost=...)`` placed below the
    route decorator. It adds ``Depends(RateLimit(rules, **options))`` to the endpoint."""
    dependency = RateLimit(rules, **options)

    def decorate(endpoint: Callable[..., Any]) -> Callable[..., Any]:
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

    return decorate
