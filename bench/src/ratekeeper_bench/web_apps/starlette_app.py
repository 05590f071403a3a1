"""The Starlette app of ``ratekeeper bench web``, served by uvicorn (``--factory``).

Variants: ``bare``; ``ratekeeper``: behind ``ratekeeper.web.RateLimitMiddleware`` (ASGI)
with one ``Rule`` on ``AppConfig.store``; ``slowapi``: the endpoint decorated with
slowapi's ``Limiter.limit`` on its memory storage, its 429 handler installed.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratekeeper_bench.web_apps import PATH, AppConfig

__all__ = ["VARIANTS", "create_app"]

VARIANTS = ("bare", "ratekeeper", "slowapi")


async def _ok(request: Request) -> Response:
    return PlainTextResponse("ok")


def create_app() -> Starlette:
    """The app for the variant in the environment (``AppConfig.from_env``)."""
    config = AppConfig.from_env()
    if config.variant == "bare":
        return Starlette(routes=[Route(PATH, _ok)])
    if config.variant == "ratekeeper":
        from ratekeeper.web import RateLimitMiddleware

        # As app.add_middleware(RateLimitMiddleware, ...) would.
        ours = Middleware(RateLimitMiddleware, rules=config.ratekeeper_rules(), store=config.store)
        return Starlette(routes=[Route(PATH, _ok)], middleware=[ours])
    if config.variant == "slowapi":
        return _slowapi_app(config)
    raise config.unknown("Starlette")


def _slowapi_app(config: AppConfig) -> Starlette:
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.util import get_remote_address

    limiter = Limiter(key_func=get_remote_address, storage_uri="memory://")

    @limiter.limit(config.limits_limit)  # type: ignore[untyped-decorator,unused-ignore]
    async def ok(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[Route(PATH, ok)],
        exception_handlers={RateLimitExceeded: _rate_limit_exceeded_handler},  # type: ignore[dict-item,unused-ignore]
    )
    app.state.limiter = limiter
    return app
