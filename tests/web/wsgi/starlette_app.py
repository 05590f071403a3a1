"""The Starlette app served by TWO uvicorn processes in the shared-store tests:
``web.wsgi.starlette_app:app``. Routes: ``/health`` and ``/items/{user}``; every response
carries ``X-Worker: <pid>`` so a test sees both processes decide."""

from __future__ import annotations

import os
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from ratekeeper.web import RateLimitMiddleware
from web.wsgi import config

PID = str(os.getpid())


async def health(request: Request) -> Any:
    return PlainTextResponse("ok", headers={"X-Worker": PID})


async def items(request: Request) -> Any:
    return JSONResponse({"user": request.path_params["user"]}, headers={"X-Worker": PID})


class _WorkerOnDenials:
    """Adds ``X-Worker`` outside the rate limiter, so refusals carry it too."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def send_with_pid(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", ()) if h[0].lower() != b"x-worker"]
                message = {**message, "headers": [*headers, (b"x-worker", PID.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_pid)


_config = config.load()
app = Starlette(
    routes=[Route("/health", health), Route("/items/{user}", items)],
    middleware=[
        Middleware(_WorkerOnDenials),
        Middleware(RateLimitMiddleware, **config.middleware_kwargs(_config)),  # type: ignore[arg-type]
    ],
)
