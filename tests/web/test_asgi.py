"""The ASGI middleware under a real uvicorn server, seen by a real HTTP client (httpx).

Header fields are parsed with ``http_sf`` (an independent implementation of RFC 8941),
never with ratekeeper's own code.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import http_sf
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ratekeeper.web import RateLimitMiddleware
from ratekeeper.web.problem import QUOTA_EXCEEDED, QUOTA_EXCEEDED_TITLE

from .conftest import http_rule
from .uvicorn_server import serve


async def item(request: Request) -> Response:
    return JSONResponse({"user": request.path_params["user"]})


def make_app(rules: list[Any], **options: Any) -> Starlette:
    app = Starlette(routes=[Route("/items/{user}", item)])
    app.add_middleware(RateLimitMiddleware, rules=rules, **options)
    return app


async def fire(url: str, n: int, **kwargs: Any) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=10) as client:
        return list(await asyncio.gather(*(client.get(url, **kwargs) for _ in range(n))))


def policy(response: httpx.Response) -> dict[str, dict[str, Any]]:
    """``RateLimit-Policy`` parsed by http_sf: policy name -> parameters."""
    parsed = http_sf.parse(response.headers["RateLimit-Policy"].encode(), tltype="list")
    return {name: dict(params) for name, params in parsed}  # type: ignore[misc]


def state(response: httpx.Response) -> dict[str, dict[str, Any]]:
    parsed = http_sf.parse(response.headers["RateLimit"].encode(), tltype="list")
    return {name: dict(params) for name, params in parsed}  # type: ignore[misc]


def test_partner_scenario_one_200_and_nine_429_with_every_field(store_url: str, rule_name: str) -> None:
    """1/3s per partner on GET /items/{user}, 10 concurrent calls: one passes, nine get a
    429 carrying every field of DESIGN.md 5.3, on each store."""
    rule = http_rule(rule_name, "1/3s", path="/items/{user}", methods=("GET",), key="{path.user}")
    with serve(make_app([rule], store=store_url)) as base:
        responses = asyncio.run(fire(f"{base}/items/acme", 10))
    statuses = sorted(r.status_code for r in responses)
    assert [200] + [429] * 9 == statuses
    for r in responses:
        assert {rule_name: {"q": 1, "w": 3}} == policy(r)
        limit_state = state(r)[rule_name]
        assert 0 == limit_state["r"]
        assert 1 <= limit_state["t"] <= 3
        assert "1" == r.headers["X-RateLimit-Limit"]
        assert "0" == r.headers["X-RateLimit-Remaining"]
        assert 1 <= int(r.headers["X-RateLimit-Reset"]) <= 3
    ok = next(r for r in responses if r.status_code == 200)
    assert {"user": "acme"} == ok.json()
    assert "Retry-After" not in ok.headers
    for r in (r for r in responses if r.status_code == 429):
        assert "application/problem+json" == r.headers["Content-Type"]
        body = json.loads(r.content)
        retry = int(r.headers["Retry-After"])
        assert 1 <= retry <= 3
        assert {
            "type": QUOTA_EXCEEDED,
            "title": QUOTA_EXCEEDED_TITLE,
            "status": 429,
            "violated-policies": [rule_name],
            "rule": rule_name,
            "limit": "1/3s",
            "retry_after": retry,
        } == {k: v for k, v in body.items() if k != "detail"}
        assert rule_name in body["detail"]
        assert retry == int(r.headers["X-RateLimit-Reset"])


def test_another_partner_is_not_limited_by_the_first(rule_name: str) -> None:
    rule = http_rule(rule_name, "1/3s", path="/items/{user}", key="{path.user}")
    with serve(make_app([rule])) as base:
        first = asyncio.run(fire(f"{base}/items/a", 2))
        other = asyncio.run(fire(f"{base}/items/b", 1))
    assert [200, 429] == sorted(r.status_code for r in first)
    assert [200] == [r.status_code for r in other]
