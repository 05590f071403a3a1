"""Lease ids cannot be guessed, and a release names a lease of its own rule and key only.

An id is 128 random bits (``secrets``), so one client that saw its own ids learns nothing
about another's. A release that names a lease held under another key (or another rule)
releases nothing, says so (``False``), and leaves both keys' states as they were: on
every store, sync and asyncio (the stores of the conformance suite but the service,
whose client and route belong to the service's own tests).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest

from conformance.harness import STORES, StoreHarness, harness_of
from conformance.traces import EPOCH_US
from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.limiter.checks import new_lease_id
from ratekeeper.op import Op
from ratekeeper.stores.bounds import MAX_LEASE_ID_LENGTH, check_lease_id

SERVER_STORES = [p for p in STORES if not str(p.values[0]).startswith("service")]


# -- the ids ------------------------------------------------------------------------------


def test_a_lease_id_is_128_random_bits_in_22_url_safe_characters() -> None:
    ids = [new_lease_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for lease in ids[:50]:
        assert len(lease) == 22 <= MAX_LEASE_ID_LENGTH
        assert len(base64.urlsafe_b64decode(lease + "==")) == 16
        assert "," not in lease and "%" not in lease  # nothing the PostgreSQL wire must escape
        check_lease_id(lease)


def test_consecutive_ids_share_no_counter_nor_prefix() -> None:
    """Two ids in a row are not predictable from each other: no common prefix or suffix
    beyond what chance gives (a shared process prefix, or a counter, would show)."""
    ids = [new_lease_id() for _ in range(400)]
    pairs = list(pairwise(ids))

    def common_prefix(a: str, b: str) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    # 64 symbols: the chance that two random ids share 3 leading (or trailing) characters is 1 in 262144
    assert max(common_prefix(a, b) for a, b in pairs) < 3
    # the last character holds only 2 bits (128 = 21 x 6 + 2): compare the ones before it
    assert max(common_prefix(a[-2::-1], b[-2::-1]) for a, b in pairs) < 3
    assert len({lease[0] for lease in ids}) > 40  # each character spreads over the alphabet


def test_the_limiters_hand_out_fresh_random_ids() -> None:
    rule = Rule("ids", ["100/minute"], algorithm="concurrency")
    with Limiter() as limiter:
        a = limiter.try_acquire(rule, "k").lease_id
        b = limiter.try_acquire(rule, "k").lease_id
    assert a is not None and b is not None and a != b and len(a) == len(b) == 22

    async def async_ids() -> tuple[str | None, str | None]:
        async with AsyncLimiter() as limiter:
            return (await limiter.try_acquire(rule, "k")).lease_id, (await limiter.try_acquire(rule, "k")).lease_id

    c, d = asyncio.run(async_ids())
    assert c is not None and d is not None and len({a, b, c, d}) == 4


# -- releases under another key, on every store ---------------------------------------------


@pytest.fixture(scope="module", params=SERVER_STORES)
def harness(request: pytest.FixtureRequest) -> Iterator[StoreHarness]:
    yield from harness_of(request)


def _peek(harness: StoreHarness, plan: Any, key: str, now: int) -> Any:
    return harness.call("decide", Op.peek(plan, key, 1), now)


def test_a_release_naming_another_keys_lease_releases_nothing(harness: StoreHarness) -> None:
    tag = harness.tag()
    plan = Rule(f"{tag}.leases", ["2/minute"], algorithm="concurrency").plan
    other_rule = Rule(f"{tag}.other", ["2/minute"], algorithm="concurrency").plan
    now = EPOCH_US
    mine, theirs = f"{tag}.mine", f"{tag}.theirs"
    a, b = new_lease_id(), new_lease_id()
    assert harness.call("decide", Op.decide(plan, mine, 1, None, a), now).allowed
    assert harness.call("decide", Op.decide(plan, theirs, 1, None, b), now).allowed
    before = (_peek(harness, plan, mine, now), _peek(harness, plan, theirs, now))

    # b is held, but under the key "theirs": releasing it under "mine" (or under another
    # rule, or an id never issued) finds nothing and changes nothing
    assert harness.call("refund", Op.refund(plan, mine, 0, b), now) is False
    assert harness.call("refund", Op.refund(other_rule, theirs, 0, b), now) is False
    assert harness.call("refund", Op.refund(plan, mine, 0, new_lease_id()), now) is False
    assert (_peek(harness, plan, mine, now), _peek(harness, plan, theirs, now)) == before
    assert before[0].remaining == before[1].remaining == 0  # a peek of cost 1 counts itself: 1 of 2 left

    # under its own key it is released, once
    assert harness.call("refund", Op.refund(plan, theirs, 0, b), now) is True
    assert _peek(harness, plan, theirs, now).remaining == 1
    assert _peek(harness, plan, mine, now) == before[0]
    assert harness.call("refund", Op.refund(plan, theirs, 0, b), now) is False


def test_the_limiters_release_says_whether_the_key_held_the_lease() -> None:
    rule = Rule("release-result", ["2/minute"], algorithm="concurrency")
    with Limiter() as limiter:
        lease = limiter.try_acquire(rule, "mine").lease_id
        assert lease is not None
        assert limiter.release(rule, "theirs", lease) is False
        assert limiter.peek(rule, "mine").remaining == 0
        assert limiter.release(rule, "mine", lease) is True
        assert limiter.release(rule, "mine", lease) is False
        assert limiter.peek(rule, "mine").remaining == 1

    async def main() -> None:
        async with AsyncLimiter() as limiter:
            lease = (await limiter.try_acquire(rule, "mine")).lease_id
            assert lease is not None
            assert await limiter.release(rule, "theirs", lease) is False
            assert await limiter.release(rule, "mine", lease) is True

    asyncio.run(main())


def test_a_refund_of_a_cost_is_given_back() -> None:
    rule = Rule("refund-result", ["5/minute"], algorithm="token_bucket")
    with Limiter() as limiter:
        assert limiter.refund(rule, "never-charged", 1) is True
        assert limiter.try_acquire(rule, "k", 2).allowed
        assert limiter.refund(rule, "k", 1) is True
        assert limiter.peek(rule, "k").remaining == 3
