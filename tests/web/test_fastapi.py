"""The FastAPI dependency and decorator under a real uvicorn server, seen by httpx."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import http_sf
import httpx
from fastapi import Depends, FastAPI, HTTPException

from ratekeeper import Rule
from ratekeeper.web import RateLimitMiddleware
from ratekeeper.web.fastapi import RateLimit, limit
from ratekeeper.web.problem import QUOTA_EXCEEDED

from .conftest import http_rule
from .uvicorn_server import serve


def parsed(value: str) -> dict[str, dict[str, Any]]:
    return {name: dict(params) for name, params in http_sf.parse(value.encode(), tltype="list")}  # type: ignore[misc]


async def fire(url: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=10) as client:
        return list(await asyncio.gather(*(client.get(url) for _ in range(n))))


def test_partner_scenario_through_the_dependency(store_url: str, rule_name: str) -> None:
    """Depends(RateLimit(rule, key="{path.user}")): 10 concurrent calls, one 200, nine
    429 with the middleware's body and headers."""
    app = FastAPI()
    per_partner = RateLimit(Rule(rule_name, "1/3s"), key="{path.user}", store=store_url)

    @app.get("/items/{user}", dependencies=[Depends(per_partner)])
    async def items(user: str) -> dict[str, str]:
        return {"user": user}

    with serve(app) as base:
        responses = asyncio.run(fire(f"{base}/items/acme", 10))
    assert [200] + [429] * 9 == sorted(r.status_code for r in responses)
    for r in responses:
        assert {rule_name: {"q": 1, "w": 3}} == parsed(r.headers["RateLimit-Policy"])
        assert 0 == parsed(r.headers["RateLimit"])[rule_name]["r"]
        assert "1" == r.headers["X-RateLimit-Limit"]
    assert {"user": "acme"} == next(r for r in responses if r.status_code == 200).json()
    for r in (r for r in responses if r.status_code == 429):
        assert "application/problem+json" == r.headers["Content-Type"]
        body = json.loads(r.content)
        assert QUOTA_EXCEEDED == body["type"]
        assert [rule_name] == body["violated-policies"]
        assert (rule_name, "1/3s") == (body["rule"], body["limit"])
        assert int(r.headers["Retry-After"]) == body["retry_after"] >= 1


def test_the_decorator_limits_one_endpoint_and_leaves_others(rule_name: str) -> None:
    app = FastAPI()

    @app.post("/auth/token")
    @limit(Rule(rule_name, ["20/minute", "2/3s"], algorithm="sliding_window_log"), key="{client_ip}")
    def token() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/free")
    async def free() -> dict[str, bool]:
        return {"ok": True}

    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        got = [client.post("/auth/token") for _ in range(3)]
        free_calls = [client.get("/free") for _ in range(5)]
    assert [200, 200, 429] == [r.status_code for r in got]
    assert {"ok": True} == got[0].json()
    assert all(r.status_code == 200 and "RateLimit" not in r.headers for r in free_calls)
    refused = got[2]
    body = refused.json()
    assert "2/3s" == body["limit"]  # the answer names the 3-second limit
    assert [f"{rule_name}.3s"] == body["violated-policies"]
    policy = parsed(refused.headers["RateLimit-Policy"])
    assert {f"{rule_name}.60s": {"q": 20, "w": 60}, f"{rule_name}.3s": {"q": 2, "w": 3}} == policy
    assert 18 == parsed(refused.headers["RateLimit"])[f"{rule_name}.60s"]["r"]  # the minute limit still shows 18 left


def test_a_callable_key_and_cost_and_refund_on_an_http_exception(rule_name: str) -> None:
    app = FastAPI()
    dep = RateLimit(
        Rule(rule_name, "3/minute"),
        key=lambda request: request.headers.get("x-partner"),
        cost=lambda request: int(request.query_params.get("n", "1")),
        refund_statuses=range(500, 600),
    )

    @app.get("/work", dependencies=[Depends(dep)])
    async def work(fail: bool = False) -> dict[str, bool]:
        if fail:
            raise HTTPException(status_code=502, detail="upstream")
        return {"ok": True}

    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        anonymous = [client.get("/work").status_code for _ in range(5)]  # no partner: not limited
        failed = [client.get("/work", params={"fail": "1", "n": "3"}, headers={"X-Partner": "p"}) for _ in range(3)]
        heavy = client.get("/work", params={"n": "3"}, headers={"X-Partner": "p"})
        after = client.get("/work", headers={"X-Partner": "p"})
    assert [200] * 5 == anonymous
    assert [502, 502, 502] == [r.status_code for r in failed]  # each charged 3, then given back
    assert 200 == heavy.status_code
    assert 429 == after.status_code


def test_middleware_and_dependency_on_one_fastapi_app(rule_name: str) -> None:
    """The ASGI middleware on a FastAPI app sees FastAPI's routes for {route}."""
    app = FastAPI()

    @app.get("/items/{user}")
    async def items(user: str) -> dict[str, str]:
        return {"user": user}

    app.add_middleware(RateLimitMiddleware, rules=[http_rule(rule_name, "1/minute", key="{route}|{path.user}")])
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        got = [client.get(p).status_code for p in ("/items/a", "/items/a", "/items/b")]
    assert [200, 429, 200] == got


def test_allowed_responses_carry_the_headers(rule_name: str) -> None:
    app = FastAPI()

    @app.get("/x")
    @limit(Rule(rule_name, "5/minute"))
    async def x() -> dict[str, int]:
        return {"n": 1}

    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        r = client.get("/x")
    assert 200 == r.status_code
    assert {rule_name: {"r": 4, "t": 12}} == parsed(r.headers["RateLimit"])
    assert "4" == r.headers["X-RateLimit-Remaining"]


def test_the_dependency_takes_a_rules_file_entry_as_a_dict(rule_name: str) -> None:
    app = FastAPI()
    per_key = RateLimit({"name": rule_name, "limits": ["2/minute"], "key": "{header.x-api-key}"})

    @app.get("/search", dependencies=[Depends(per_key)])
    async def search() -> dict[str, bool]:
        return {"ok": True}

    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        k1 = [client.get("/search", headers={"x-api-key": "k1"}).status_code for _ in range(3)]
        k2 = client.get("/search", headers={"x-api-key": "k2"})
    assert [200, 200, 429] == k1
    assert 200 == k2.status_code
    assert {rule_name: {"q": 2, "w": 60}} == parsed(k2.headers["RateLimit-Policy"])
