"""What a client is told is true (issue 17, section 3), through real servers: uvicorn with
Starlette and FastAPI, gunicorn with Flask and Django. Every header is parsed with
http_sf, an independent RFC 9651 parser."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import http_sf
import httpx
import pytest
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ratekeeper import Rule
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.web import RateLimitMiddleware
from ratekeeper.web.fastapi import RateLimit
from ratekeeper.web.problem import LIMITER_UNAVAILABLE
from servers import free_port

from .conftest import http_rule
from .uvicorn_server import serve


def parsed(value: str) -> dict[str, dict[str, Any]]:
    return {name: dict(params) for name, params in http_sf.parse(value.encode(), tltype="list")}  # type: ignore[misc]


def integer(value: str) -> int:
    item, _ = http_sf.parse(value.encode(), tltype="item")  # type: ignore[misc]
    assert isinstance(item, int)
    return item


async def item(request: Request) -> Response:
    return JSONResponse({"ok": True})


def starlette(rules: list[Any], **options: Any) -> Starlette:
    app = Starlette(routes=[Route("/items/{user}", item), Route("/login", item)])
    app.add_middleware(RateLimitMiddleware, rules=rules, **options)
    return app


def quota_headers(response: httpx.Response) -> list[str]:
    return [name for name in response.headers if "ratelimit" in name.lower()]


def test_a_sub_second_limit_is_advertised_at_its_real_rate(rule_name: str) -> None:
    """10/100ms is 100 a second: ``q=100;w=1``, not ``q=10;w=1``."""
    with serve(starlette([http_rule(rule_name, "10/100ms")])) as base:
        r = httpx.get(f"{base}/items/a", timeout=10)
    assert 200 == r.status_code
    assert {rule_name: {"q": 100, "w": 1}} == parsed(r.headers["RateLimit-Policy"])
    assert 9 == parsed(r.headers["RateLimit"])[rule_name]["r"]


def test_a_concurrency_rule_is_not_advertised_as_a_rate(rule_name: str) -> None:
    rules = [http_rule(rule_name + ".c", "5/minute", algorithm="concurrency"), http_rule(rule_name, "7/minute")]
    with serve(starlette(rules)) as base:
        r = httpx.get(f"{base}/items/a", timeout=10)
    assert 200 == r.status_code
    assert {rule_name: {"q": 7, "w": 60}} == parsed(r.headers["RateLimit-Policy"])
    assert [rule_name] == list(parsed(r.headers["RateLimit"]))
    assert "7" == r.headers["X-RateLimit-Limit"]


def test_a_cost_that_never_fits_says_nothing_is_left_and_when_the_window_resets(rule_name: str) -> None:
    """x-cost 20 on 10/minute: not "retry now" (t=0, X-RateLimit-Reset: 0)."""
    rule = http_rule(rule_name, "10/minute", cost="{header.x-cost}", algorithm="fixed_window")
    with serve(starlette([rule])) as base:
        fresh = httpx.get(f"{base}/items/a", headers={"x-cost": "20"}, timeout=10)
        httpx.get(f"{base}/items/a", headers={"x-cost": "3"}, timeout=10)
        used = httpx.get(f"{base}/items/a", headers={"x-cost": "20"}, timeout=10)
    for r in (fresh, used):
        assert 429 == r.status_code
        state = parsed(r.headers["RateLimit"])[rule_name]
        assert 0 == state["r"] and 1 <= state["t"] <= 60
        assert 0 == integer(r.headers["X-RateLimit-Remaining"])
        assert 1 <= integer(r.headers["X-RateLimit-Reset"]) <= 60
        assert "Retry-After" not in r.headers  # waiting does not help
        assert "will not be admitted" in r.json()["detail"]


def test_fallback_admissions_carry_no_quota_and_a_fail_closed_rule_says_the_limiter_is_unavailable(
    rule_name: str,
) -> None:
    limiter = AsyncLimiter(f"redis://127.0.0.1:{free_port()}/0", timeout=0.3, on_error="allow")  # nothing listens there
    rules = [
        http_rule(rule_name, "5/minute", path="/items/{user}"),
        http_rule(rule_name + ".login", "5/minute", path="/login", on_error="deny"),
    ]
    with serve(starlette(rules, limiter=limiter)) as base:
        admitted = httpx.get(f"{base}/items/a", timeout=10)
        refused = httpx.get(f"{base}/login", timeout=10)
    assert 200 == admitted.status_code
    assert [] == quota_headers(admitted)
    assert 503 == refused.status_code
    assert [] == quota_headers(refused)
    assert LIMITER_UNAVAILABLE == refused.json()["type"]
    assert "application/problem+json" == refused.headers["content-type"]
    assert integer(refused.headers["Retry-After"]) >= 1
    assert integer(refused.headers["Retry-After"]) == refused.json()["retry_after"]


def test_x_ratelimit_reset_as_an_epoch_on_request(rule_name: str) -> None:
    with serve(starlette([http_rule(rule_name, "1/minute")], x_ratelimit_reset="epoch")) as base:
        before = time.time()
        r = httpx.get(f"{base}/items/a", timeout=10)
    reset = integer(r.headers["X-RateLimit-Reset"])
    assert before + 59 <= reset <= time.time() + 61
    assert parsed(r.headers["RateLimit"])[rule_name]["t"] == 60  # RateLimit's t stays seconds from now


def test_a_refused_request_charges_no_shadow_rule(rule_name: str) -> None:
    """Shadow rules measure what goes through: of five requests two are refused, so the
    shadow rule (2/minute, one key) sees three and would refuse only the last."""
    from ratekeeper.metrics import Metrics

    metrics = Metrics()
    enforced = http_rule(rule_name, "1/minute", key="{header.x-k}")
    shadow = http_rule(rule_name + ".dry", "2/minute", shadow=True)
    with serve(starlette([enforced, shadow], metrics=metrics)) as base:
        got = [httpx.get(f"{base}/items/a", headers={"x-k": k}, timeout=10).status_code for k in "11123"]
    assert [200, 429, 429, 200, 200] == got
    assert 1 == metrics.value("ratekeeper_decisions_total", rule=rule_name + ".dry", outcome="shadow_over")


# -- the middleware and a FastAPI dependency on one route ------------------------------------


def fastapi_app(outer: str, inner: str) -> FastAPI:
    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, rules=[http_rule(outer, "5/minute")])
    per_user = RateLimit(Rule(inner, "2/minute"), key="{path.user}")

    @app.get("/items/{user}", dependencies=[Depends(per_user)])
    async def items(user: str) -> dict[str, str]:
        return {"user": user}

    return app


def test_the_middleware_and_a_dependency_answer_one_set_of_headers(rule_name: str) -> None:
    outer, inner = rule_name + ".site", rule_name + ".user"
    with serve(fastapi_app(outer, inner)) as base:
        r = httpx.get(f"{base}/items/a", timeout=10)
    assert 200 == r.status_code
    for name in ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit", "RateLimit-Policy"):
        assert 1 == len(r.headers.get_list(name)), name
    # the tightest: 1 left of 2 (the dependency's), not 4 of 5
    assert ("2", "1") == (r.headers["X-RateLimit-Limit"], r.headers["X-RateLimit-Remaining"])
    assert {outer: {"q": 5, "w": 60}, inner: {"q": 2, "w": 60}} == parsed(r.headers["RateLimit-Policy"])
    assert {outer: 4, inner: 1} == {k: v["r"] for k, v in parsed(r.headers["RateLimit"]).items()}


def test_a_dependency_refusal_charges_nothing_anywhere(rule_name: str) -> None:
    """Two admitted, three refused by the dependency: the middleware's rule (5/minute)
    was charged twice only, so two more requests for another user pass it."""
    outer, inner = rule_name + ".site", rule_name + ".user"
    with serve(fastapi_app(outer, inner)) as base:
        a = [httpx.get(f"{base}/items/a", timeout=10) for _ in range(5)]
        b = [httpx.get(f"{base}/items/b", timeout=10) for _ in range(2)]
    assert [200, 200, 429, 429, 429] == [r.status_code for r in a]
    assert [200, 200] == [r.status_code for r in b]
    assert "0" == b[-1].headers["X-RateLimit-Remaining"]  # the dependency's, the tightest
    assert 1 == parsed(b[-1].headers["RateLimit"])[outer]["r"]
    refused = a[-1]
    assert 1 == len(refused.headers.get_list("X-RateLimit-Limit"))
    assert "2" == refused.headers["X-RateLimit-Limit"]


# -- gunicorn with Flask and Django -----------------------------------------------------------

WSGI_TARGETS = {
    "flask": ("gunicorn", "web.wsgi.flask_app:app"),
    "django": ("gunicorn", "web.wsgi.django_project.django_wsgi:application"),
}


@pytest.fixture(scope="module", params=list(WSGI_TARGETS))
def wsgi_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from web.wsgi.appserver import AppServer

    kind, target = WSGI_TARGETS[request.param]
    rules = [
        {
            "name": "truth.fast",
            "methods": ["GET"],
            "path": "/items/{user}",
            "key": "{path.user}",
            "limits": ["10/100ms"],
        },
        {"name": "truth.cost", "path": "/header", "cost": "{header.x-cost}", "limits": ["10/minute"]},
    ]
    config = {"store": "memory://", "rules": rules, "options": {"x_ratelimit_reset": "epoch"}}
    path: Path = tmp_path_factory.mktemp(f"truth-{request.param}")
    with AppServer(target, config, path, kind=kind, name=request.param) as app:
        yield app


def test_wsgi_servers_tell_the_truth_too(wsgi_server: Any) -> None:
    fast = httpx.get(f"{wsgi_server.url}/items/a", timeout=10)
    assert {"truth.fast": {"q": 100, "w": 1}} == parsed(fast.headers["RateLimit-Policy"])
    never = httpx.get(f"{wsgi_server.url}/header", headers={"x-cost": "20"}, timeout=10)
    assert 429 == never.status_code
    assert 0 == parsed(never.headers["RateLimit"])["truth.cost"]["r"]
    assert parsed(never.headers["RateLimit"])["truth.cost"]["t"] >= 1
    assert integer(never.headers["X-RateLimit-Reset"]) > time.time()  # an epoch, as configured
    assert json.loads(never.content)["retry_after"] is None
