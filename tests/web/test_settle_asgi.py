"""``response_cost`` through Starlette under a real uvicorn: a streamed body settled at its
end (and still streamed, never buffered), a client that goes away mid-stream, a cost
header that puts the key in debt or refunds, on memory and on the real Redis."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ratekeeper import Rule
from ratekeeper.config.model import HttpRule, KeyTemplate
from ratekeeper.limiter.limiter import Limiter
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.stores.url import open_store
from ratekeeper.testing import FakeClock
from ratekeeper.web import RateLimitMiddleware, usage

from .uvicorn_server import serve
from .watched import WatchedAsyncLimiter as Watched

PEER = "127.0.0.1"
WAIT = 10.0  # bound of every wait for the server: a hang fails the test instead of blocking it


def limiters(kind: str, prefix: str, clock: FakeClock, fail: bool = False) -> tuple[Watched, Limiter]:
    """The middleware's limiter and one over the same store for the test to read it."""
    if kind == "memory":
        store = open_store("memory://", clock=clock)
        return Watched(store, fail=fail), Limiter(store)
    url = f"redis://127.0.0.1:6379/0?prefix={prefix}"
    return Watched(url, fail=fail), Limiter(url)


STORES = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


def rule(name: str, limits: str, algorithm: str = "fixed_window") -> HttpRule:
    return HttpRule(Rule(name, limits, algorithm), key=KeyTemplate.parse("{client_ip}"))


def used(limiter: Limiter, r: HttpRule, count: int) -> int:
    return count - limiter.peek(r.rule, PEER).remaining - 1


class Streams:
    """The app's streamed route: ``parts`` chunks of ``size`` bytes, each added to the
    request's meter before it is sent; after ``hold_after`` chunks it waits for ``go``
    (set by the test thread), or for ever when ``go`` is None (the client leaves)."""

    def __init__(self, parts: int, size: int, hold_after: int, go: threading.Event | None) -> None:
        self.parts, self.size, self.hold_after, self.go = parts, size, hold_after, go

    async def endpoint(self, request: Request) -> Response:
        meter = usage(request)

        async def body() -> AsyncIterator[bytes]:
            for i in range(self.parts):
                if i == self.hold_after:
                    if self.go is None:
                        await asyncio.Event().wait()
                    else:
                        await asyncio.to_thread(self.go.wait, WAIT)
                meter.add(self.size)
                yield b"x" * (self.size - 1) + b"\n"

        return StreamingResponse(body(), media_type="text/plain")


async def tokens(request: Request) -> Response:
    return PlainTextResponse("ok", headers={"x-tokens-used": request.query_params.get("n", "")})


def app(route: Streams, r: HttpRule, limiter: AsyncLimiter, **options: Any) -> Starlette:
    a = Starlette(routes=[Route("/stream", route.endpoint), Route("/tokens", tokens)])
    a.add_middleware(RateLimitMiddleware, rules=[r], limiter=limiter, response_cost="x-tokens-used", **options)
    return a


def lines(response: httpx.Response) -> Iterator[str]:
    yield from response.iter_lines()


@pytest.mark.parametrize("kind", STORES)
def test_a_streamed_body_streams_and_is_settled_at_its_end(kind: str, rule_name: str, key_prefix: str) -> None:
    r = rule(rule_name, "1000/day")
    watched, reader = limiters(kind, key_prefix, FakeClock())
    go = threading.Event()
    with serve(app(Streams(4, 25, 1, go), r, watched)) as url, httpx.Client(timeout=WAIT) as client:
        with client.stream("GET", f"{url}/stream") as response:
            assert response.status_code == 200
            received = lines(response)
            next(received)  # the first chunk arrives while the app holds the rest: not buffered
            assert used(reader, r, 1000) == 1  # charged 1 when admitted; not settled yet
            go.set()
            assert len(list(received)) == 3
        watched.wait()
        assert used(reader, r, 1000) == 100


def test_a_client_that_goes_away_mid_stream_is_charged_what_was_streamed(rule_name: str) -> None:
    r = rule(rule_name, "1000/day")
    watched, reader = limiters("memory", "", FakeClock())
    with serve(app(Streams(10, 20, 2, None), r, watched)) as url, httpx.Client(timeout=WAIT) as client:
        with client.stream("GET", f"{url}/stream") as response:
            received = lines(response)
            next(received)
            next(received)
        # the connection is closed: uvicorn tells the app, Starlette stops the stream
        watched.wait()
        assert used(reader, r, 1000) == 40


@pytest.mark.parametrize("kind", STORES)
def test_a_cost_over_the_charge_puts_the_key_in_debt(kind: str, rule_name: str, key_prefix: str) -> None:
    r = rule(rule_name, "10/minute", "gcra")
    clock = FakeClock()
    watched, _ = limiters(kind, key_prefix, clock)
    with serve(app(Streams(1, 1, 1, None), r, watched)) as url, httpx.Client(timeout=WAIT) as client:
        assert client.get(f"{url}/tokens", params={"n": "25"}).status_code == 200
        watched.wait()
        refused = client.get(f"{url}/tokens", params={"n": "1"})
        assert refused.status_code == 429
        retry = int(refused.headers["retry-after"])
        assert retry > 6  # more than one request's share of the minute: the debt
        if kind == "memory":  # the injected clock: admitted once time has paid the debt back
            clock.advance(retry - 1)
            assert client.get(f"{url}/tokens", params={"n": "1"}).status_code == 429
            clock.advance(1)
            assert client.get(f"{url}/tokens", params={"n": "1"}).status_code == 200


@pytest.mark.parametrize("kind", STORES)
def test_a_cost_under_the_charge_is_refunded(kind: str, rule_name: str, key_prefix: str) -> None:
    r = rule(rule_name, "3/minute")
    watched, reader = limiters(kind, key_prefix, FakeClock())
    with serve(app(Streams(1, 1, 1, None), r, watched)) as url, httpx.Client(timeout=WAIT) as client:
        for _ in range(6):  # twice the limit: each request cost nothing
            assert client.get(f"{url}/tokens", params={"n": "0"}).status_code == 200
            watched.wait()
        assert used(reader, r, 3) == 0
        statuses = [client.get(f"{url}/tokens").status_code for _ in range(4)]  # no cost stated: 1 each
        assert statuses == [200, 200, 200, 429]


def test_hostile_cost_headers_keep_the_charge(rule_name: str) -> None:
    r = rule(rule_name, "100/minute")
    watched, reader = limiters("memory", "", FakeClock())
    values = ["-5", "9" * 4000, "1e3", "0x10", "\xb2", "12 34", "+7"]
    with serve(app(Streams(1, 1, 1, None), r, watched)) as url, httpx.Client(timeout=WAIT) as client:
        for value in values:
            assert client.get(f"{url}/tokens", params={"n": value}).status_code == 200
        # a settlement waited for, of an amount of its own: the hostile ones settled nothing by then
        assert client.get(f"{url}/tokens", params={"n": "5"}).status_code == 200
        watched.wait()
        assert used(reader, r, 100) == len(values) + 5


def test_a_store_error_while_settling_does_not_break_the_response(rule_name: str) -> None:
    r = rule(rule_name, "1000/day")
    watched, reader = limiters("memory", "", FakeClock(), fail=True)
    go = threading.Event()
    go.set()
    with serve(app(Streams(3, 10, 1, go), r, watched)) as url, httpx.Client(timeout=WAIT) as client:
        response = client.get(f"{url}/stream")
        assert (response.status_code, len(response.content)) == (200, 30)
        watched.wait()
        assert used(reader, r, 1000) == 1  # the settlement failed: the request kept its charge
        assert client.get(f"{url}/tokens", params={"n": "4"}).status_code == 200
