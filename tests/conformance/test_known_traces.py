"""Traces that once showed a store deciding differently from the reference, kept on every store.

Each is a minimal trace (as hypothesis printed it, or built by hand from a report) with
the behaviour it pins in its name; they run on every store of the suite, so a bug found
in one store is checked in all of them.
"""

from __future__ import annotations

import pytest

from conformance.harness import StoreHarness
from conformance.traces import EPOCH_US, Acquire, Advance, RuleSpec, Session, Trace
from ratekeeper.limit import Limit

ONE_PER_SECOND_GCRA = RuleSpec("gcra", (Limit.from_us(1, 1_000_000),))

KNOWN = {
    # The memory store timed each generation's expiry from its *last* write, so a write at
    # an earlier (stepped back) time made a sweep drop k0 while k0 was not whole yet: k0
    # was then admitted again 0.2 s too early (found 2026-11-23).
    "a_write_after_the_clock_steps_back_never_expires_a_newer_state": Trace(
        (ONE_PER_SECOND_GCRA,),
        3,
        EPOCH_US,
        (
            Acquire(0, 2, 1),  # the first call of a fresh store sweeps: the next sweep is 1 s later
            Advance(500_000),
            Acquire(0, 0, 1),  # k0 is whole again at +1.5 s
            Advance(-300_000),  # the clock steps back
            Acquire(0, 1, 1),  # k1, written at +0.2 s, is whole at +1.2 s
            Advance(1_100_000),  # +1.3 s: a sweep; k1 may go, k0 may not
            Acquire(0, 0, 1),  # refused: k0 is whole only at +1.5 s
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_known_trace_decides_like_the_reference(harness: StoreHarness, name: str) -> None:
    trace = KNOWN[name]
    Session(harness.call, trace.rules, trace.keys, trace.start, harness.tag()).run(trace.ops)
