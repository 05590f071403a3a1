"""``response_cost`` through FastAPI's ``RateLimit`` dependency under a real uvicorn: a
streamed body metered by ``usage(request)``, a cost set on the injected ``Response``, a
route's own ``Response`` under ``@limit`` above the route decorator, and a refund by
status winning over the settlement."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse

from ratekeeper import Rule
from ratekeeper.limiter.limiter import Limiter
from ratekeeper.stores.url import open_store
from ratekeeper.testing import FakeClock
from ratekeeper.web import usage
from ratekeeper.web.fastapi import RateLimit, limit

from .uvicorn_server import serve
from .watched import WatchedAsyncLimiter as Watched

PEER = "127.0.0.1"
WAIT = 10.0


def used(limiter: Limiter, rule: Rule, count: int = 1000) -> int:
    return count - limiter.peek(rule, PEER).remaining - 1


def pair(kind: str, prefix: str) -> tuple[Watched, Limiter]:
    if kind == "memory":
        store = open_store("memory://", clock=FakeClock())
        return Watched(store), Limiter(store)
    url = f"redis://127.0.0.1:6379/0?prefix={prefix}"
    return Watched(url), Limiter(url)


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_the_dependency_settles_a_streamed_body_and_the_injected_responses_cost(
    kind: str, rule_name: str, key_prefix: str
) -> None:
    rule = Rule(rule_name, "1000/day", "fixed_window")
    limiter, reader = pair(kind, key_prefix)
    dependency = RateLimit(rule, limiter=limiter, response_cost="x-tokens-used", refund_statuses=[503])
    app = FastAPI()

    @app.get("/chat", dependencies=[Depends(dependency)])
    async def chat(request: Request) -> StreamingResponse:
        meter = usage(request)

        async def tokens() -> AsyncIterator[bytes]:
            for word in (b"one ", b"two ", b"three"):
                meter.add(len(word))
                yield word

        return StreamingResponse(tokens(), media_type="text/plain")

    @app.get("/complete", dependencies=[Depends(dependency)])
    async def complete(response: Response, n: str = "", fail: bool = False) -> dict[str, str]:
        response.headers["x-tokens-used"] = n
        if fail:
            raise HTTPException(503, "upstream down")
        return {"ok": "yes"}

    with serve(app) as url, httpx.Client(timeout=WAIT) as client:
        response = client.get(f"{url}/chat")
        assert (response.status_code, response.text) == (200, "one two three")
        limiter.wait()
        assert used(reader, rule) == 13
        assert client.get(f"{url}/complete", params={"n": "20"}).status_code == 200
        limiter.wait()
        assert used(reader, rule) == 33
        assert client.get(f"{url}/complete", params={"n": "0"}).status_code == 200
        limiter.wait()
        assert used(reader, rule) == 33
        # a refund by status wins: the whole charge back, the 50 never charged
        assert client.get(f"{url}/complete", params={"n": "50", "fail": "true"}).status_code == 503
        limiter.wait()
        assert used(reader, rule) == 33


def test_limit_above_the_route_reads_the_routes_own_response(rule_name: str) -> None:
    rule = Rule(rule_name, "1000/day", "fixed_window")
    limiter, reader = pair("memory", "")
    app = FastAPI()

    @limit(rule, limiter=limiter, response_cost="x-rows")
    @app.get("/export")
    async def export(n: str = "") -> PlainTextResponse:
        return PlainTextResponse("rows", headers={"X-Rows": n})

    with serve(app) as url, httpx.Client(timeout=WAIT) as client:
        assert client.get(f"{url}/export", params={"n": "9"}).status_code == 200
        limiter.wait()
        assert used(reader, rule) == 9
        for hostile in ("-3", "9" * 300, "4.5"):
            assert client.get(f"{url}/export", params={"n": hostile}).status_code == 200
        # a settlement waited for, of an amount of its own: the hostile ones settled nothing by then
        assert client.get(f"{url}/export", params={"n": "5"}).status_code == 200
        limiter.wait()
        assert used(reader, rule) == 17  # 9, each hostile one kept its charge of 1, then 5
