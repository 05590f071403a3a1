"""Issue 9 on every store of the suite, through the public API: limits at the largest count
every store decides exactly (item 4), and one refusal of a malformed lease id everywhere
(item 6)."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.harness import StoreHarness
from conformance.test_keys import Calls
from ratekeeper import Rule
from ratekeeper.errors import InvalidRequest
from ratekeeper.limit import MAX_COUNT

T0 = 1_700_000_040_000_000  # a whole minute (µs)


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_log", "sliding_window_counter", "concurrency"])
def test_a_limit_of_the_largest_count_is_decided_exactly(harness: StoreHarness, algorithm: str) -> None:
    """2**50 per hour: every store counts it down by the cost, exactly, as the reference."""
    tag = harness.tag()
    calls = Calls(harness)
    rule = Rule(f"{tag}.largest", [f"{MAX_COUNT}/hour"], algorithm)
    plan = rule.plan
    state: Any = None
    for cost in (1, 2**49, 2**48, 2**48 - 2, 2, 1):  # 2**50 - 1 admitted, 2 refused, the last 1 admitted
        lease = "lease" if plan.leases else None
        state, expected = plan.algorithm.decide(plan, state, T0, cost, None, lease)
        got = calls.try_acquire(rule, "k", cost, now=T0)
        assert (expected.allowed, expected.remaining) == (got.allowed, got.remaining)
    assert (True, 0) == (got.allowed, got.remaining)
    assert not calls.try_acquire(rule, "k", 1, now=T0).allowed


def test_release_with_a_malformed_lease_id_is_one_invalid_request_on_every_store(harness: StoreHarness) -> None:
    tag = harness.tag()
    calls = Calls(harness)
    rule = Rule(f"{tag}.leases", ["2/minute"], "concurrency")
    held = calls.try_acquire(rule, "k")
    assert held.allowed and held.lease_id
    for bad in ("", None, 7, b"id", "x" * 129, "a\x00b", "\ud800"):
        with pytest.raises(InvalidRequest, match="lease"):
            calls.release(rule, "k", bad)
    assert 1 == calls.peek(rule, "k", 0).remaining  # still held
    calls.release(rule, "k", "never-issued")  # the right form, not held: harmless
    calls.release(rule, "k", held.lease_id)
    assert 2 == calls.peek(rule, "k", 0).remaining
