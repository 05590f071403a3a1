"""``response_cost`` through Django's middleware, sync (``WSGIHandler`` under wsgiref) and
async (``ASGIHandler`` under uvicorn): a ``StreamingHttpResponse`` is settled when Django
closes it, with what the view added to ``usage(request)``; a cost header charges more or
refunds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

django = pytest.importorskip("django")

from django.core.handlers.asgi import ASGIHandler  # type: ignore[import-untyped]  # noqa: E402
from django.core.handlers.wsgi import WSGIHandler  # type: ignore[import-untyped]  # noqa: E402
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse  # type: ignore[import-untyped]  # noqa: E402
from django.test import override_settings  # type: ignore[import-untyped]  # noqa: E402
from django.urls import path  # type: ignore[import-untyped]  # noqa: E402

from ratekeeper import Rule  # noqa: E402
from ratekeeper.config.model import HttpRule, KeyTemplate  # noqa: E402
from ratekeeper.limiter.limiter import Limiter  # noqa: E402
from ratekeeper.stores.url import open_store  # noqa: E402
from ratekeeper.testing import FakeClock  # noqa: E402
from ratekeeper.web import usage  # noqa: E402

from .django_in_process import configure  # noqa: E402
from .uvicorn_server import serve  # noqa: E402
from .watched import WatchedAsyncLimiter, WatchedLimiter  # noqa: E402
from .wsgiref_server import serving, wsgiref  # noqa: E402

PEER = "127.0.0.1"
WAIT = 10.0

configure()


def stream(request: HttpRequest) -> StreamingHttpResponse:
    meter = usage(request)

    def rows() -> Iterator[bytes]:
        for i in range(6):
            meter.add(4)
            yield b"row %d\n" % i

    return StreamingHttpResponse(rows(), content_type="text/plain")


async def astream(request: HttpRequest) -> StreamingHttpResponse:
    meter = usage(request)

    async def rows() -> AsyncIterator[bytes]:
        for i in range(5):
            meter.add(7)
            yield b"row %d\n" % i
            await asyncio.sleep(0)

    return StreamingHttpResponse(rows(), content_type="text/plain")


def cost(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", headers={"X-Cost": request.GET.get("n", "")})


async def acost(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", headers={"X-Cost": request.GET.get("n", "")})


urlpatterns = [path("stream", stream), path("astream", astream), path("cost", cost), path("acost", acost)]


def used(limiter: Limiter, r: HttpRule, count: int) -> int:
    return count - limiter.peek(r.rule, PEER).remaining - 1


@contextmanager
def configured(r: HttpRule, limiter: Any) -> Iterator[None]:
    options = {"rules": [r], "limiter": limiter, "response_cost": "x-cost"}
    with override_settings(
        ROOT_URLCONF=__name__, MIDDLEWARE=["ratekeeper.web.django.RateLimitMiddleware"], RATEKEEPER=options
    ):
        yield


def test_sync_django_settles_a_streamed_response_and_a_cost_header(rule_name: str) -> None:
    r = HttpRule(Rule(rule_name, "1000/day", "fixed_window"), key=KeyTemplate.parse("{client_ip}"))
    limiter = WatchedLimiter(open_store("memory://", clock=FakeClock()))
    with configured(r, limiter), serving(wsgiref(WSGIHandler())) as url, httpx.Client(timeout=WAIT) as client:
        response = client.get(f"{url}/stream")
        assert response.status_code == 200 and response.text.count("row") == 6
        limiter.wait()
        assert used(limiter, r, 1000) == 24
        assert client.get(f"{url}/cost", params={"n": "0"}).status_code == 200
        limiter.wait()
        assert used(limiter, r, 1000) == 24
        # not ASCII digits alone, though int() reads them (10, 3): each keeps its charge of 1
        for hostile in ("1_0", "+3"):
            assert client.get(f"{url}/cost", params={"n": hostile}).status_code == 200
        # a settlement waited for, of an amount of its own: the hostile ones settled nothing by then
        assert client.get(f"{url}/cost", params={"n": "5"}).status_code == 200
        limiter.wait()
        assert used(limiter, r, 1000) == 31  # 24, the two kept 1 each, then 5


def test_sync_django_a_cost_over_the_charge_puts_the_key_in_debt(rule_name: str) -> None:
    r = HttpRule(Rule(rule_name, "5/minute", "gcra"), key=KeyTemplate.parse("{client_ip}"))
    clock = FakeClock()
    limiter = WatchedLimiter(open_store("memory://", clock=clock))
    with configured(r, limiter), serving(wsgiref(WSGIHandler())) as url, httpx.Client(timeout=WAIT) as client:
        assert client.get(f"{url}/cost", params={"n": "12"}).status_code == 200
        limiter.wait()
        refused = client.get(f"{url}/cost", params={"n": "1"})
        assert refused.status_code == 429
        clock.advance(int(refused.headers["retry-after"]))
        assert client.get(f"{url}/cost", params={"n": "1"}).status_code == 200


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_async_django_settles_a_streamed_response_when_it_closes_it(kind: str, rule_name: str, key_prefix: str) -> None:
    r = HttpRule(Rule(rule_name, "1000/day", "fixed_window"), key=KeyTemplate.parse("{client_ip}"))
    if kind == "memory":
        store = open_store("memory://", clock=FakeClock())
        limiter, reader = WatchedAsyncLimiter(store), Limiter(store)
    else:
        url = f"redis://127.0.0.1:6379/0?prefix={key_prefix}"
        limiter, reader = WatchedAsyncLimiter(url), Limiter(url)
    with configured(r, limiter), serve(ASGIHandler(), lifespan="off") as url, httpx.Client(timeout=WAIT) as client:
        response = client.get(f"{url}/astream")
        assert response.status_code == 200 and response.text.count("row") == 5
        limiter.wait()
        assert used(reader, r, 1000) == 35
        assert client.get(f"{url}/acost", params={"n": "5"}).status_code == 200
        limiter.wait()
        assert used(reader, r, 1000) == 40
        assert client.get(f"{url}/acost", params={"n": "0"}).status_code == 200  # charged 1, refunded
        limiter.wait()
        assert used(reader, r, 1000) == 40
