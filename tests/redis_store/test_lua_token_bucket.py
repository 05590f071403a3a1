"""token_bucket.lua decides as algorithms/token_bucket.py, field by field: at epoch µs
near 2^53, across a clock that steps back, with reservations, refunds, peeks and batches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lua_traces import assert_traces_match

from ratekeeper import Rule
from ratekeeper.algorithms.base import UNBOUNDED_WAIT
from ratekeeper.op import Op
from ratekeeper.stores.redis.store import RedisStore

pytestmark = pytest.mark.redis

URL = "redis://127.0.0.1:6379/0"
NEAR_2_53 = 9_007_199_254_740_991 - 10**12  # µs: now * d would pass 2^53; nothing here may form it


@pytest.fixture
def store(key_prefix: str) -> Iterator[RedisStore]:
    s = RedisStore(URL, prefix=f"{key_prefix}:")
    yield s
    for key in s.shell.client.scan_iter(match=f"{key_prefix}:*", count=1000):
        s.shell.client.delete(key)
    s.close()


def test_refill_to_the_microsecond_near_2_53_with_a_fine_rate(store: RedisStore) -> None:
    """999999/s: a token is 10^6 units and the bucket gains 999999 a µs; the bucket is full
    exactly ceil((full - level) / d) µs after the last take, not a µs sooner."""
    plan = Rule("tb-fine", ["999999/s"], algorithm="token_bucket", burst=3).plan
    state: Any = None
    t = NEAR_2_53
    for dt, cost in [(0, 3), (1, 1), (1, 1), (2, 0), (3, 1), (0, 2), (1, 3), (2, 3)]:
        t += dt
        state, expected = plan.decide(state, t, cost, None, None)
        assert store.decide(Op.decide(plan, "k", cost), t) == expected


def test_clock_stepped_back_never_refills_twice(store: RedisStore) -> None:
    """The refill point stays at the latest time written: after a step back the bucket
    refills from there, as the reference does."""
    plan = Rule("tb-back", ["2/s", "5/10s"], algorithm="token_bucket", burst=3).plan
    state: Any = None
    now = 1_750_000_000_123_457
    for t, cost in [(now, 2), (now - 500_000, 1), (now, 1), (now + 500_000, 1), (now + 250_000, 1)]:
        state, expected = plan.decide(state, t, cost, None, None)
        assert store.decide(Op.decide(plan, "k", cost), t) == expected


def test_unbounded_reservations_take_the_level_below_zero_and_refunds_cap_it_at_full(store: RedisStore) -> None:
    plan = Rule("tb-res", ["3/7s"], algorithm="token_bucket").plan
    state: Any = None
    now = NEAR_2_53
    for cost in (3, 3, 2):
        state, expected = plan.decide(state, now, cost, UNBOUNDED_WAIT, None)
        assert expected.allowed
        assert store.decide(Op.decide(plan, "k", cost, UNBOUNDED_WAIT), now) == expected
    assert expected.delay_us > 7_000_000  # the level is below zero: the third waits past a full refill
    store.refund(Op.refund(plan, "k", 20), now + 1)
    state = plan.algorithm.refund(plan, state, now + 1, 20)
    assert store.decide(Op.decide(plan, "k", 0), now + 2) == plan.decide(state, now + 2, 0, None, None)[1]


def test_random_traces_decide_like_the_reference(store: RedisStore) -> None:
    assert_traces_match(
        store,
        "token_bucket",
        seed=7,
        limit_sets=[["3/7s"], ["10/s", "3/100ms"], ["999999/s"], ["3/7s", "2/5s", "11/13s"]],
        starts=[1000, 1_750_000_000_123_457, NEAR_2_53],
        steps=[0, 1, 17, 100_000, 999_999, 3_000_000, -5000, -1_000_000],
        bursts=[None, 2, 5],
        max_waits=[None, None, 0, 500_000, UNBOUNDED_WAIT],
    )


def test_batch_is_all_or_nothing_and_items_see_each_other(store: RedisStore) -> None:
    plan = Rule("tb-many", ["3/s"], algorithm="token_bucket").plan
    now = NEAR_2_53
    items = [Op.decide(plan, "a", 2), Op.decide(plan, "b", 1), Op.decide(plan, "a", 1)]
    state_a, first = plan.decide(None, now, 2, None, None)
    _, second = plan.decide(None, now, 1, None, None)
    _, third = plan.decide(state_a, now, 1, None, None)
    assert store.decide_many(items, now) == (first, second, third)
    refused = store.decide_many([Op.decide(plan, "b", 1), Op.decide(plan, "a", 1)], now)
    assert [d.allowed for d in refused] == [True, False]
    # nothing of the refused batch was charged: b still has 2 tokens
    assert store.decide(Op.decide(plan, "b", 2), now).allowed
