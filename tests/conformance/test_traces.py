"""Every store decides exactly as the reference algorithms, decision by decision.

Hypothesis draws traces (``conformance.traces``): one to three rules of an algorithm
(or of mixed algorithms), small limits with periods from 1 µs to minutes, a start among
small times, epoch microseconds and the far future, and operations that advance the clock
(by 0, 1 µs, around a period, hours, or back), acquire (with and without reservations),
peek, refund, release leases, reset and batch. Each trace runs on the store under test
and on the reference at the same explicit ``now``; the first decision that differs in
any field fails the test with the trace so far.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from conformance.harness import StoreHarness
from conformance.traces import ALGORITHM_NAMES, Session, Trace, examples, traces

pytestmark = pytest.mark.slow  # hypothesis traces on every store

CONFORMANCE = settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("algorithm", [*ALGORITHM_NAMES, "mixed"])
def test_store_decides_every_trace_like_the_reference(harness: StoreHarness, algorithm: str) -> None:
    """Every decision of the store equals the reference's, field by field (``mixed``: rules
    of different algorithms in one trace, batched together)."""

    @CONFORMANCE
    @given(traces(None if algorithm == "mixed" else algorithm))
    def check(trace: Trace) -> None:
        Session(harness.call, trace.rules, trace.keys, trace.start, harness.tag(), trace.names).run(trace.ops)

    check()
