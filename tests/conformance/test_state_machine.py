"""Every store follows the reference as a hypothesis state machine.

The same comparison as ``test_traces`` (``conformance.traces.Session``), driven by a
``RuleBasedStateMachine``: one rule (any algorithm), two keys, and steps that advance the
clock (sometimes back), acquire, reserve, peek, charge without a check, refund or
release, and reset, chosen and
shrunk by hypothesis step by step. At the end every key is peeked once more.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from conformance.harness import StoreHarness
from conformance.traces import (
    HOUR_US,
    LEASING,
    RESERVING,
    STARTS,
    Acquire,
    Advance,
    Charge,
    Peek,
    Refund,
    Release,
    Reset,
    RuleSpec,
    Session,
    examples,
    rule_specs,
)
from ratekeeper.algorithms.base import UNBOUNDED_WAIT

pytestmark = pytest.mark.slow  # hypothesis state machines on every store

KEYS = st.integers(0, 1)
COSTS = st.one_of(st.just(1), st.integers(0, 11))
"""Mostly 1, up to one more than the largest capacity the rules draw (10)."""
STEPS = st.one_of(
    st.just(0),
    st.just(1),
    st.integers(2, 1_000),
    st.integers(1_000, 10_000_000),
    st.integers(1, 10).map(lambda hours: hours * HOUR_US),
    st.integers(1, 5_000_000).map(lambda us: -us),
)
WAITS = st.one_of(st.none(), st.just(0), st.integers(0, 30_000_000), st.just(UNBOUNDED_WAIT))


def test_store_follows_the_reference_step_by_step(harness: StoreHarness) -> None:
    """Every decision of a random walk of steps equals the reference's, field by field."""

    class Conformance(RuleBasedStateMachine):
        session: Session
        spec: RuleSpec

        @initialize(spec=rule_specs(), start=STARTS)
        def begin(self, spec: RuleSpec, start: int) -> None:
            self.spec = spec
            self.session = Session(harness.call, (spec,), 2, start, harness.tag())

        @rule(us=STEPS)
        def advance(self, us: int) -> None:
            self.session.apply(Advance(us))

        @rule(key=KEYS, cost=COSTS)
        def acquire(self, key: int, cost: int) -> None:
            self.session.apply(Acquire(0, key, cost))

        @rule(key=KEYS, cost=COSTS, max_wait=WAITS)
        def reserve(self, key: int, cost: int, max_wait: int | None) -> None:
            self.session.apply(Acquire(0, key, cost, max_wait if self.spec.algorithm in RESERVING else None))

        @rule(key=KEYS, cost=COSTS)
        def peek(self, key: int, cost: int) -> None:
            self.session.apply(Peek(0, key, cost))

        @rule(key=KEYS, cost=st.one_of(st.just(1), st.integers(0, 31)))
        def charge(self, key: int, cost: int) -> None:
            if self.spec.algorithm in LEASING:
                self.session.apply(Peek(0, key, cost))
            else:
                self.session.apply(Charge(0, key, cost))

        @rule(key=KEYS, cost=COSTS, lease=st.integers(0, 7))
        def give_back(self, key: int, cost: int, lease: int) -> None:
            leasing = self.spec.algorithm in LEASING
            self.session.apply(Release(0, key, lease) if leasing else Refund(0, key, cost))

        @rule(key=KEYS)
        def reset(self, key: int) -> None:
            self.session.apply(Reset(0, key))

        def teardown(self) -> None:
            session = getattr(self, "session", None)
            if session is not None and not session.broken:
                session.finish()

    run_state_machine_as_test(
        Conformance,
        settings=settings(
            max_examples=examples(40),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )
