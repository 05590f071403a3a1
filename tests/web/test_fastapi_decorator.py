"""``@limit("5/minute", key=...)`` below and above the route decorator, under a real
uvicorn server seen by httpx: FastAPI routes, a router included afterwards and plain
Starlette routes."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from ratekeeper.errors import InvalidLimit
from ratekeeper.web.fastapi import limit
from ratekeeper.web.problem import QUOTA_EXCEEDED

from .uvicorn_server import serve


def assert_limited(responses: list[httpx.Response], admitted: int) -> None:
    """``admitted`` 200s then 429s, every answer with our headers, each 429 our problem+json."""
    assert [200] * admitted + [429] * (len(responses) - admitted) == [r.status_code for r in responses]
    for r in responses:
        assert str(admitted) == r.headers["X-RateLimit-Limit"]
        assert "RateLimit-Policy" in r.headers
    for r in responses[admitted:]:
        assert "application/problem+json" == r.headers["Content-Type"]
        body = json.loads(r.content)
        assert QUOTA_EXCEEDED == body["type"]
        assert body["limit"].startswith(f"{admitted}/")
        assert int(r.headers["Retry-After"]) == body["retry_after"] >= 1


def test_below_the_route_decorator_a_limit_string_keys_by_client_address() -> None:
    app = FastAPI()

    @app.get("/ping")
    @limit("2/minute")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        got = [client.get("/ping") for _ in range(3)]
    assert_limited(got, 2)
    assert {"ok": True} == got[0].json()
    assert json.loads(got[2].content)["rule"].endswith("ping")


def test_above_the_route_decorator_the_route_is_limited_by_the_key_function() -> None:
    app = FastAPI()

    @limit("2/minute", key=lambda request: request.headers.get("x-user"))
    @app.get("/items/{item}")
    def items(item: str) -> dict[str, str]:
        return {"item": item}

    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        alice = [client.get("/items/a", headers={"x-user": "alice"}) for _ in range(3)]
        bob = client.get("/items/b", headers={"x-user": "bob"})
        anonymous = [client.get("/items/c") for _ in range(3)]  # the key function's None skips the rule
    assert_limited(alice, 2)
    assert {"item": "a"} == alice[0].json()
    assert 200 == bob.status_code and "1" == bob.headers["X-RateLimit-Remaining"]
    assert [200] * 3 == [r.status_code for r in anonymous]


def test_above_the_route_decorator_an_error_status_reaches_the_client() -> None:
    """The wrapped route still answers its own errors (here 422, a missing query
    parameter), and they count against the limit."""
    app = FastAPI()

    @limit("1/minute")
    @app.get("/search")
    async def search(q: str) -> dict[str, str]:
        return {"q": q}

    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        got = [client.get("/search"), client.get("/search", params={"q": "x"})]
    assert [422, 429] == [r.status_code for r in got]
    assert "X-RateLimit-Limit" in got[0].headers


def test_above_a_router_decorator_the_included_route_is_limited() -> None:
    router = APIRouter()

    @limit(["2/minute", "10/hour"])
    @router.get("/report")
    async def report(request: Request) -> dict[str, str]:
        return {"client": request.client.host if request.client else ""}

    app = FastAPI()
    app.include_router(router, prefix="/v1")
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        got = [client.get("/v1/report") for _ in range(3)]
    assert [200, 200, 429] == [r.status_code for r in got]
    assert "application/problem+json" == got[2].headers["Content-Type"]


def test_a_plain_starlette_route_is_limited() -> None:
    async def hello(request: Request) -> JSONResponse:
        return JSONResponse({"hello": request.path_params["name"]})

    app = Starlette(routes=[Route("/hello/{name}", hello)])
    limit("2/minute")(hello)  # above the route: the route is registered first
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        got = [client.get("/hello/x") for _ in range(3)]
    assert_limited(got, 2)
    assert {"hello": "x"} == got[0].json()


def test_above_the_route_decorator_a_returned_response_gets_the_headers() -> None:
    app = FastAPI()

    @limit("1/minute")
    @app.get("/raw")
    async def raw() -> JSONResponse:
        return JSONResponse({"raw": True}, headers={"x-app": "1"})

    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        got = [client.get("/raw") for _ in range(2)]
    assert [200, 429] == [r.status_code for r in got]
    assert "1" == got[0].headers["x-app"] and "1" == got[0].headers["X-RateLimit-Limit"]


def test_a_limit_string_that_does_not_parse_fails_at_import() -> None:
    with pytest.raises(InvalidLimit, match="did you mean 'minute'"):
        limit("5/minuet")
    with pytest.raises(InvalidLimit, match="cannot parse limit 'x'"):
        limit(["5/minute", "x"])
