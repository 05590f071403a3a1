"""concurrency.lua decides as algorithms/concurrency.py, field by field: leases taken under
string ids, expiring ``period`` after they were taken, released by id; at epoch µs near
2^53, across a clock that steps back, through peeks and batches."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from ratekeeper import Rule
from ratekeeper.algorithms.base import Plan
from ratekeeper.op import DECIDE, PEEK, Op
from ratekeeper.stores.redis.store import RedisStore

pytestmark = pytest.mark.redis

URL = "redis://127.0.0.1:6379/0"
NEAR_2_53 = 9_007_199_254_740_991 - 10**12


@pytest.fixture
def store(key_prefix: str) -> Iterator[RedisStore]:
    s = RedisStore(URL, prefix=f"{key_prefix}:")
    yield s
    for key in s.shell.client.scan_iter(match=f"{key_prefix}:*", count=1000):
        s.shell.client.delete(key)
    s.close()


class Twin:
    """The store and the reference driven side by side for one key."""

    def __init__(self, store: RedisStore, plan: Plan) -> None:
        self.store, self.plan, self.state = store, plan, None

    def take(self, now: int, cost: int, lease: str | None) -> Any:
        self.state, expected = self.plan.decide(self.state, now, cost, None, lease)
        got = self.store.decide(Op.decide(self.plan, "k", cost, None, lease), now)
        assert got == expected
        return got

    def release(self, now: int, lease: str) -> None:
        self.state = self.plan.algorithm.refund(self.plan, self.state, now, 0, lease)
        self.store.refund(Op.refund(self.plan, "k", 0, lease), now)


def test_leases_expire_after_the_period_and_a_release_frees_one_early(store: RedisStore) -> None:
    twin = Twin(store, Rule("cc-leases", ["3/5s", "5/20s"], algorithm="concurrency").plan)
    now = NEAR_2_53
    assert twin.take(now, 2, "a").lease_id == "a"
    assert twin.take(now + 1, 1, "b").allowed
    refused = twin.take(now + 2, 1, "c")
    assert (refused.allowed, refused.denied_index, refused.retry_us) == (False, 0, 4_999_998)  # when "a" expires
    twin.release(now + 3, "nobody")  # an unknown id releases nothing
    assert not twin.take(now + 4, 1, "c").allowed
    twin.release(now + 5, "a")
    assert twin.take(now + 6, 2, "c").allowed
    assert twin.take(now + 5_000_006, 2, "d").allowed  # "c" expired from the 3/5s limit, not from 5/20s
    assert twin.take(now + 5_000_008, 4, "e").retry_us == -1  # more than 3: never


def test_expiry_past_2_53_is_exact(store: RedisStore) -> None:
    """A lease taken at 2^53 - 1 for a day expires after 2^53: the time until then is exact."""
    twin = Twin(store, Rule("cc-far", ["1/day"], algorithm="concurrency").plan)
    now = 2**53 - 1
    twin.take(now, 1, "a")
    assert twin.take(now, 1, "b").retry_us == 86_400_000_000
    assert twin.take(now, 0, "c").reset_us == (86_400_000_000,)


def test_a_lease_taken_after_the_clock_stepped_back_stays_after_the_newest(store: RedisStore) -> None:
    twin = Twin(store, Rule("cc-back", ["2/s"], algorithm="concurrency").plan)
    now = 1_750_000_000_123_457
    twin.take(now, 1, "a")
    twin.take(now - 700_000, 1, "b")  # recorded at now: expires with "a", not 0.7 s before it
    assert twin.take(now + 999_999, 1, "c").retry_us == 1
    assert twin.take(now + 1_000_000, 2, "c").allowed


def test_leases_dropped_by_a_refusal_stay_dropped_when_the_clock_steps_back(store: RedisStore) -> None:
    twin = Twin(store, Rule("cc-drop", ["1/s"], algorithm="concurrency").plan)
    now = NEAR_2_53
    twin.take(now, 1, "a")
    twin.take(now + 1_000_000, 2, "b")  # refused (cost > limit); "a" expired and is dropped
    twin.take(now + 500_000, 1, "c")  # the clock stepped back: "a" is gone for the reference


def test_random_traces_decide_like_the_reference(store: RedisStore) -> None:
    rng = random.Random(13)
    taken = 0
    for trial in range(12):
        plan = Rule(
            f"cc{trial}",
            rng.choice([["3/7s"], ["1/3s"], ["10/s", "3/100ms"], ["5/3s", "20/minute"]]),
            algorithm="concurrency",
        ).plan
        now = rng.choice([1000, 1_750_000_000_123_457, NEAR_2_53])
        states: dict[str, Any] = {}
        for _ in range(40):
            now += rng.choice([0, 1, 17, 100_000, 999_999, 3_000_000, 10_000_000, -700_000])
            key = rng.choice("ab")
            if rng.random() < 0.2:
                lease = rng.choice([*(states.get(key) or ())[0::3], "unknown"])
                store.refund(Op.refund(plan, key, 0, lease), now)
                states[key] = plan.algorithm.refund(plan, states.get(key), now, 0, lease)
                continue
            cost, commit = rng.randint(0, 4), rng.random() > 0.2
            taken += 1
            lease = f"lease-{taken}" if commit else None
            new, expected = plan.decide(states.get(key), now, cost, None, lease)
            if commit:
                states[key] = new
            assert store.decide(Op((DECIDE if commit else PEEK, plan, key, cost, None, lease)), now) == expected


def test_batch_is_all_or_nothing_and_items_see_each_other(store: RedisStore) -> None:
    plan = Rule("cc-many", ["2/s"], algorithm="concurrency").plan
    now = NEAR_2_53
    state, first = plan.decide(None, now, 1, None, "x")
    _, second = plan.decide(state, now, 1, None, "y")
    assert store.decide_many([Op.decide(plan, "a", 1, None, "x"), Op.decide(plan, "a", 1, None, "y")], now) == (
        first,
        second,
    )
    refused = store.decide_many([Op.decide(plan, "b", 1, None, "p"), Op.decide(plan, "a", 1, None, "q")], now)
    assert [d.allowed for d in refused] == [True, False]
    assert store.decide(Op.decide(plan, "b", 2, None, "r"), now).allowed  # b's item of the refused batch took no lease
