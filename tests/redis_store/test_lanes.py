"""The stores send their coalesced decision calls on lanes (``lane_async.py`` and its
generated twin ``lane.py``): connections of the pool held for them (at most
``max_in_flight``), not the client's ``execute_command``. A lane
whose connection was lost connects again and the call is sent again, as the client would;
``aclose`` gives the lanes back to the pool.

Each test runs on a private ``redis-server`` (``redis_server``): it kills connections.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.stores.redis.lane import Lane
from ratekeeper.stores.redis.lane_async import AsyncLane
from ratekeeper.stores.redis.store import RedisStore
from ratekeeper.stores.redis.store_async import AsyncRedisStore
from servers import RedisServer

pytestmark = pytest.mark.redis

RULE = Rule("lanes", ["1000/minute"], algorithm="gcra", on_error="deny")
"""A failed call would be a refusal (``on_error="deny"``), never an admission."""


def test_coalesced_calls_go_on_at_most_max_in_flight_lanes_and_aclose_returns_them(redis_server: RedisServer) -> None:
    async def run() -> tuple[int, int, int]:
        limiter = AsyncLimiter(f"{redis_server.url}?max_in_flight=2", prefix="lanes:")
        store = limiter.store
        assert isinstance(store, AsyncRedisStore)
        sent: list[Any] = []
        original = AsyncLane.execute_command

        async def spy(lane: AsyncLane, *args: Any) -> Any:
            sent.append(lane)
            return await original(lane, *args)

        AsyncLane.execute_command = spy  # type: ignore[method-assign]
        try:
            decisions = await asyncio.gather(*(limiter.try_acquire(RULE, f"k{i % 7}") for i in range(300)))
        finally:
            AsyncLane.execute_command = original  # type: ignore[method-assign]
        assert all(d.allowed for d in decisions)
        pool = store.shell.client.connection_pool
        held = len(pool._in_use_connections)
        await limiter.aclose()
        return len({id(lane) for lane in sent}), held, len(pool._in_use_connections)

    lanes, held, after = asyncio.run(run())
    assert 1 <= lanes <= 2  # every decision call went on a lane; never more lanes than slots
    assert held == lanes  # the lanes hold their connections between calls
    assert after == 0  # aclose gave them back


def test_a_lane_whose_connection_was_killed_connects_again_and_no_caller_sees_it(redis_server: RedisServer) -> None:
    async def run() -> list[bool]:
        limiter = AsyncLimiter(redis_server.url, prefix="lanes:")
        try:
            first = await asyncio.gather(*(limiter.try_acquire(RULE, "k") for _ in range(20)))
            with redis.Redis.from_url(redis_server.url) as admin:
                killed = admin.client_kill_filter(_type="normal", skipme=True)
            assert killed >= 1
            second = await asyncio.gather(*(limiter.try_acquire(RULE, "k") for _ in range(20)))
            return [d.allowed for d in (*first, *second)]
        finally:
            await limiter.aclose()

    assert asyncio.run(run()) == [True] * 40


def test_threads_send_their_coalesced_calls_on_at_most_max_in_flight_lanes_and_close_returns_them(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    limiter = Limiter(f"{redis_server.url}?max_in_flight=2", prefix="lanes:")
    store = limiter.store
    assert isinstance(store, RedisStore)
    sent: list[Lane] = []
    original = Lane.execute_command

    def spy(lane: Lane, *args: Any) -> Any:
        sent.append(lane)
        return original(lane, *args)

    monkeypatch.setattr(Lane, "execute_command", spy)
    with ThreadPoolExecutor(8) as threads:
        decisions = list(threads.map(lambda i: limiter.try_acquire(RULE, f"k{i % 7}"), range(300)))
    assert all(d.allowed for d in decisions)
    lanes = {id(lane) for lane in sent}
    assert 1 <= len(lanes) <= 2  # every decision call went on a lane; never more lanes than slots
    assert {id(lane) for lane in store.shell.lanes} == lanes  # idle, holding their connections
    limiter.close()
    assert store.shell.lanes == []
