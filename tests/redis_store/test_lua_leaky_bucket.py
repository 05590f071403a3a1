"""leaky_bucket.lua decides as algorithms/leaky_bucket.py, field by field: delays of the
queue and retries bounded by max_wait, at epoch µs near 2^53, across a clock that steps
back, through refunds, peeks and batches."""

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


def test_admits_with_the_queue_delay_and_bounds_it_by_max_wait(store: RedisStore) -> None:
    """A queue of 4 draining 2/s: each admitted request waits for the ones ahead; a caller
    that waits at most 1 s is refused until the queue is 1 s short, and told when."""
    plan = Rule("lb-queue", ["2/s"], algorithm="leaky_bucket", burst=4).plan
    state: Any = None
    now = NEAR_2_53
    delays = []
    for t, cost, max_wait in [
        (now, 1, None),
        (now, 2, None),
        (now + 1, 1, 1_000_000),
        (now + 1, 1, None),
        (now + 2, 1, None),
    ]:
        state, expected = plan.decide(state, t, cost, max_wait, None)
        assert store.decide(Op.decide(plan, "k", cost, max_wait), t) == expected
        delays.append((expected.allowed, expected.delay_us, expected.retry_us))
    assert delays[1] == (True, 500_000, 0)
    assert delays[2][0] is False and delays[2][2] > 0  # the queue is 1.5 s long: wait 0.5 s more


def test_clock_stepped_back_keeps_the_queue(store: RedisStore) -> None:
    plan = Rule("lb-back", ["2/s", "5/10s"], algorithm="leaky_bucket", burst=3).plan
    state: Any = None
    now = 1_750_000_000_123_457
    for t, cost in [(now, 2), (now - 500_000, 1), (now, 1), (now + 500_000, 1), (now + 250_000, 1), (now - 3, 0)]:
        state, expected = plan.decide(state, t, cost, None, None)
        assert store.decide(Op.decide(plan, "k", cost), t) == expected


def test_random_traces_decide_like_the_reference(store: RedisStore) -> None:
    assert_traces_match(
        store,
        "leaky_bucket",
        seed=11,
        limit_sets=[["3/7s"], ["10/s", "3/100ms"], ["999999/s"], ["3/7s", "2/5s", "11/13s"]],
        starts=[1000, 1_750_000_000_123_457, NEAR_2_53],
        steps=[0, 1, 17, 100_000, 999_999, 3_000_000, -5000, -1_000_000],
        bursts=[None, 2, 5],
        max_waits=[None, None, 0, 500_000, UNBOUNDED_WAIT],
    )


def test_batch_is_all_or_nothing_and_items_see_each_other(store: RedisStore) -> None:
    plan = Rule("lb-many", ["3/s"], algorithm="leaky_bucket").plan
    now = NEAR_2_53
    state_a, first = plan.decide(None, now, 2, None, None)
    _, second = plan.decide(None, now, 1, None, None)
    _, third = plan.decide(state_a, now, 1, None, None)
    assert third.delay_us > 0  # the second item of "a" queues behind the first
    items = [Op.decide(plan, "a", 2), Op.decide(plan, "b", 1), Op.decide(plan, "a", 1)]
    assert store.decide_many(items, now) == (first, second, third)
    refused = store.decide_many([Op.decide(plan, "b", 1), Op.decide(plan, "a", 1)], now)
    assert [d.allowed for d in refused] == [True, False]
    assert store.decide(Op.decide(plan, "b", 2), now).allowed  # b's item of the refused batch was not charged
