"""fixed_window.lua decides as algorithms/fixed_window.py, field by field: at epoch µs
near 2^53, across a clock that steps back, through refunds and peeks."""

from __future__ import annotations

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
    plan = Rule("fw-back", ["3/s", "5/10s"], algorithm="fixed_window").plan
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
        "fixed_window",
        seed=4,
        limit_sets=[["3/7s"], ["10/s", "3/100ms"], ["4/s", "9/3s", "2/250ms"]],
        starts=[1000, 1_750_000_000_123_457, NEAR_2_53 - 10**9],
        steps=[0, 17, 100_000, 999_999, 3_000_000, -5000, -1_000_000],
    )
