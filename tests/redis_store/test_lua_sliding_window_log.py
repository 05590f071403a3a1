"""sliding_window_log.lua decides as algorithms/sliding_window_log.py, field by field: long
logs (hundreds of live entries) that expire a few at a time, several limits over one log,
a clock that steps back (entries stamped with the newest time), refunds that cut into
entries, peeks, at epoch µs near 2^53."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ratekeeper import Rule
from ratekeeper.op import DECIDE, PEEK, Op
from ratekeeper.stores import wire
from ratekeeper.stores.redis.store import RedisStore

pytestmark = pytest.mark.redis

URL = "redis://127.0.0.1:6379/0"
NEAR_2_53 = 9_007_199_254_000_000


@pytest.fixture
def store(key_prefix: str) -> Iterator[RedisStore]:
    s = RedisStore(URL, prefix=f"{key_prefix}:")
    yield s
    s.close()


@pytest.mark.parametrize("limits", [["200/s"], ["50/100ms", "120/s", "400/5s"]])
def test_long_logs_expire_a_few_entries_at_a_time_like_the_reference(store: RedisStore, limits: list[str]) -> None:
    plan = Rule("swl-long", limits, algorithm="sliding_window_log").plan
    rng = random.Random(len(limits))
    now = NEAR_2_53 - 10**10
    state: Any = None
    longest = 0
    for _ in range(500):
        now += rng.choice([0, 1, 1000, 2500, 5000, 10_000, -3000, 40_000])
        cost = rng.choice([1, 1, 1, 2, 3, 0])
        if rng.random() < 0.05:
            store.refund(Op.refund(plan, "k", cost), now)
            state = plan.algorithm.refund(plan, state, now, cost)
            continue
        commit = rng.random() > 0.1
        new, expected = plan.decide(state, now, cost, None, None)
        if commit:
            state = new
        assert store.decide(Op((DECIDE if commit else PEEK, plan, "k", cost, None, None)), now) == expected
        longest = max(longest, 0 if state is None else state[4] - state[3])
    assert longest >= 100  # the logs were long, as the test says


def test_stored_log_holds_only_live_entries_rebased_to_the_first(store: RedisStore, key_prefix: str) -> None:
    """Expired entries are dropped when a new one is written, and the rest are small numbers:
    one absolute time, then an offset and a running total per entry."""
    plan = Rule("swl-layout", ["10/s"], algorithm="sliding_window_log").plan
    t0 = 1_750_000_000_123_457
    for dt, cost in [(0, 2), (300_000, 1), (900_000, 3), (1_200_000, 1)]:
        assert store.decide(Op.decide(plan, "k", cost), t0 + dt).allowed
    client = redis.Redis.from_url(URL)
    try:
        raw = client.eval(
            "return cmsgpack.unpack(redis.call('GET', KEYS[1]))", 1, wire.storage_key(f"{key_prefix}:", plan, "k")
        )
    finally:
        client.close()
    assert raw == [t0 + 300_000, 0, 1, 600_000, 4, 900_000, 5]


def test_refund_cuts_into_the_newest_entries_and_empties_the_log(store: RedisStore) -> None:
    plan = Rule("swl-refund", ["10/s", "12/3s"], algorithm="sliding_window_log").plan
    now = NEAR_2_53 - 5_000_000
    state: Any = None
    steps = [
        (0, 3, "d"),
        (100, 4, "d"),
        (-50, 2, "d"),
        (10, 5, "r"),
        (0, 9, "d"),
        (1_000_100, 2, "r"),
        (0, 6, "d"),
        (0, 40, "r"),
        (0, 1, "d"),
    ]
    for dt, cost, mode in steps:
        now += dt
        if mode == "r":
            store.refund(Op.refund(plan, "k", cost), now)
            state = plan.algorithm.refund(plan, state, now, cost)
            continue
        state, expected = plan.decide(state, now, cost, None, None)
        assert store.decide(Op.decide(plan, "k", cost), now) == expected
    assert state is not None  # the last charge started a new log after the refund emptied it
