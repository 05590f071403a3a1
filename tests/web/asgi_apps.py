"""The ASGI integrations the hostile-input and proxy tests run, each built the way an
application would build it: Starlette with the middleware, FastAPI with the middleware,
FastAPI with the ``RateLimit`` dependency, and a bare ASGI app wrapped by the middleware.

Every app answers ``/ip``, ``/items/{user}``, ``/header`` and ``/health`` with 200 (JSON).
``make(kind, rules, **options)`` gives the app; ``rules`` are ``HttpRule``s (the
dependency is given them as they are).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ratekeeper.web import RateLimitMiddleware
from ratekeeper.web.fastapi import RateLimit

__all__ = ["KINDS", "make"]

KINDS = ("starlette", "fastapi", "fastapi-dependency", "raw-asgi")
PATHS = ("/ip", "/items/{user}", "/header", "/health")


async def _answer(request: Request) -> JSONResponse:
    return JSONResponse({"path": request.url.path})


def _starlette() -> Starlette:
    return Starlette(routes=[Route(p, _answer) for p in PATHS])


def _fastapi(dependencies: list[Any]) -> FastAPI:
    app = FastAPI()
    for p in PATHS:
        app.add_api_route(p, _answer, methods=["GET"], dependencies=dependencies)
    return app


async def _raw(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = json.dumps({"path": scope["path"]}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def make(kind: str, rules: Any, **options: Any) -> Any:
    """The ``kind`` app (one of ``KINDS``) limited by ``rules`` with ``options``."""
    if kind == "starlette":
        app = _starlette()
        app.add_middleware(RateLimitMiddleware, rules=rules, **options)
        return app
    if kind == "fastapi":
        fast = _fastapi([])
        fast.add_middleware(RateLimitMiddleware, rules=rules, **options)
        return fast
    if kind == "fastapi-dependency":
        return _fastapi([Depends(RateLimit(rules, **options))])
    if kind == "raw-asgi":
        return RateLimitMiddleware(_raw, rules=rules, **options)
    raise ValueError(f"unknown kind {kind!r}")
