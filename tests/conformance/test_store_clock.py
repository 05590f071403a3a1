"""A decision on the store's own clock is the reference's at an instant the clock passed.

Without an explicit ``now`` the store decides at its clock: Redis ``TIME``,
PostgreSQL ``clock_timestamp()`` (both this machine's wall clock, since the servers run
here), the memory store's monotonic clock. One charge on that clock, bracketed by two
reads of the same clock, must be the reference decision at some microsecond ``t`` of
the bracket, and a peek at an explicit later time must then see the state that charge at
``t`` left: so the store's clock is read in whole microseconds and its state is written
at it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from conformance.harness import StoreHarness
from conformance.traces import ALGORITHM_NAMES
from ratekeeper.op import Op
from ratekeeper.rule import Rule

LIMIT = "3/7s"  # a fractional emission interval (7/3 s per unit)


def _clock(harness: StoreHarness) -> Callable[[], int]:
    """Reads of the clock the store decides by."""
    clock = getattr(harness.store, "clock", None)
    if clock is not None and harness.name.startswith("memory"):
        now_us: Callable[[], int] = clock.now_us
        return now_us
    return lambda: time.time_ns() // 1000


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_a_decision_on_the_store_clock_is_the_reference_at_an_instant_between_two_clock_reads(
    harness: StoreHarness, algorithm: str
) -> None:
    tag = harness.tag()
    plan = Rule(f"{tag}.clock", [LIMIT], algorithm).plan
    key = f"{tag}.k"
    lease = f"{tag}.lease" if plan.leases else None
    read = _clock(harness)

    before = read()
    got = harness.call("decide", Op.decide(plan, key, 1, None, lease))
    after = read()
    later = after + 1_000_000
    seen = harness.call("decide", Op.peek(plan, key, 1), later)

    instants = []
    for t in range(before, after + 1):
        state, decision = plan.algorithm.decide(plan, None, t, 1, None, lease)
        if decision == got and plan.algorithm.decide(plan, state, later, 1, None, None)[1] == seen:
            instants.append(t)
    assert instants, (
        f"no instant in [{before}, {after}] gives the store's decision {tuple.__repr__(got)} "
        f"and then, at {later}, its peek {tuple.__repr__(seen)}"
    )
