"""sliding_window_counter.lua decides as algorithms/sliding_window_counter.py, field by field:
at epoch µs near 2^53, across a clock that steps back, through refunds and peeks, and where
the retry's integer product passes 2^53 (the Lua divides it exactly, bit by bit)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from lua_traces import assert_traces_match

from ratekeeper import Rule
from ratekeeper.op import Op
from ratekeeper.stores.redis.store import RedisStore

pytestmark = pytest.mark.redis

URL = "redis://127.0.0.1:6379/0"
NEAR_2_53 = 9_007_199_254_000_000  # µs: window * period and every end stay exact in doubles


@pytest.fixture
def store(key_prefix: str) -> Iterator[RedisStore]:
    s = RedisStore(URL, prefix=f"{key_prefix}:")
    yield s
    s.close()


def test_clock_stepped_back_stays_in_the_newer_window_and_refunds_there(store: RedisStore) -> None:
    plan = Rule("swc-back", ["3/s", "5/10s"], algorithm="sliding_window_counter").plan
    now = NEAR_2_53 - 3_500_000
    state: Any = None
    for t, cost, refund in [
        (now, 2, False),
        (now - 2_000_000, 1, False),
        (now - 2_000_000, 1, True),
        (now - 1_999_000, 2, False),
        (now + 1, 1, False),
        (now + 1_000_000, 3, False),
    ]:
        if refund:
            store.refund(Op.refund(plan, "k", cost), t)
            state = plan.algorithm.refund(plan, state, t, cost)
            continue
        state, expected = plan.decide(state, t, cost, None, None)
        assert store.decide(Op.decide(plan, "k", cost), t) == expected


def test_random_traces_decide_like_the_reference(store: RedisStore) -> None:
    assert_traces_match(
        store,
        "sliding_window_counter",
        seed=4,
        limit_sets=[["3/7s"], ["10/s", "3/100ms"], ["4/s", "9/3s", "2/250ms"]],
        starts=[1000, 1_750_000_000_123_457, NEAR_2_53 - 10**9],
        steps=[0, 17, 100_000, 999_999, 3_000_000, -5000, -1_000_000],
    )


def test_retry_of_a_large_daily_limit_divides_a_product_beyond_2_53_exactly(store: RedisStore) -> None:
    """(limit - current - cost) * period passes 2^53 for a million a day: the retries still
    equal the reference's (Python divides the exact integer product)."""
    plan = Rule("swc-day", ["1000000/day"], algorithm="sliding_window_counter").plan
    day = 86_400_000_000
    now = (1_750_000_000_123_457 // day) * day + 5
    state: Any = None
    rng = random.Random(9)
    waits = 0
    for step in range(40):
        cost = 999_999 if step == 0 else rng.randint(1, 300_000)
        state, expected = plan.decide(state, now, cost, None, None)
        waits += not expected.allowed and expected[4] > 0
        assert store.decide(Op.decide(plan, "k", cost), now) == expected
        now += day if step == 0 else rng.randint(1, day // 40)
    assert waits >= 5  # the trace reached the retries it is about
