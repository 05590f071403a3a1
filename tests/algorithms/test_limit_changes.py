"""A key's state read under changed limits: what was consumed stays consumed.

The reference functions, driven at explicit times: a rule whose limits change (a reload,
a quota's answer, the quota fetched after the failsafe) keeps each key's consumption
(docs/choices.md, "When a limit changes"). The stores must equal these decisions:
tests/stores/test_limit_changes_stores.py and the conformance traces (rules sharing a name).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper.algorithms.base import Plan
from ratekeeper.decision import Decision
from ratekeeper.limit import Limit
from ratekeeper.rule import Rule

S = 1_000_000
T0 = 1_700_000_040_000_000
"""An epoch time on a whole minute: fixed windows begin at T0."""

BUCKETS = ("token_bucket", "gcra", "leaky_bucket")
WINDOWS = ("fixed_window", "sliding_window_log", "sliding_window_counter")


def hits(plan: Plan, state: Any, now: int, count: int) -> tuple[Any, list[Decision]]:
    """``count`` requests of cost 1 at ``now`` under ``plan``, through the generic reference."""
    decisions = []
    for _ in range(count):
        state, decision = plan.algorithm.decide(plan, state, now, 1, None, None)
        decisions.append(decision)
    return state, decisions


def admitted(decisions: list[Decision]) -> int:
    return sum(d.allowed for d in decisions)


@pytest.mark.parametrize("algorithm", BUCKETS + WINDOWS)
def test_failsafe_then_quota_counts_what_the_failsafe_admitted(algorithm: str) -> None:
    """The issue's case: 2/minute (a quota's failsafe), then the provider's 3/minute within
    the second: 3 admitted in all, not 5."""
    rule = Rule("api", ["2/minute"], algorithm)
    state, first = hits(rule.plan, None, T0, 2)
    state, then = hits(rule.plan_for((Limit.parse("3/minute"),)), state, T0, 5)
    assert admitted(first) == 2
    assert admitted(then) == 1


@pytest.mark.parametrize("algorithm", BUCKETS + WINDOWS)
def test_tightening_a_limit_hands_out_no_fresh_budget(algorithm: str) -> None:
    """10/minute with 8 used, tightened to 3/minute: nothing is left (8 >= 3)."""
    rule = Rule("api", ["10/minute"], algorithm)
    state, used = hits(rule.plan, None, T0, 8)
    tight = rule.plan_for((Limit.parse("3/minute"),))
    _, after = hits(tight, state, T0 + 1, 3)
    assert admitted(used) == 8
    assert admitted(after) == 0
    assert after[0].remaining_each == (0,)


@pytest.mark.parametrize("algorithm", BUCKETS + WINDOWS)
def test_loosening_a_limit_keeps_what_was_consumed(algorithm: str) -> None:
    """10/minute with 8 used, raised to 20/minute: 12 more, not 20 (Bucket4j's additive)."""
    rule = Rule("api", ["10/minute"], algorithm)
    state, _ = hits(rule.plan, None, T0, 8)
    loose = rule.plan_for((Limit.parse("20/minute"),))
    _, after = hits(loose, state, T0, 20)
    assert admitted(after) == 12


@pytest.mark.parametrize("algorithm", BUCKETS)
def test_a_partly_refilled_unit_still_counts_as_consumed(algorithm: str) -> None:
    """10/minute (a token each 6 s), 10 used, 9 s later: 1.5 refilled under the old limit.
    Carried to 60/minute, ceil(8.5) = 9 stay consumed: 51 left, never 52."""
    rule = Rule("api", ["10/minute"], algorithm)
    state, _ = hits(rule.plan, None, T0, 10)
    faster = rule.plan_for((Limit.parse("60/minute"),))
    _, after = hits(faster, state, T0 + 9 * S, 60)
    assert admitted(after) == 51


@pytest.mark.parametrize("algorithm", BUCKETS)
def test_the_new_limit_refills_at_its_own_rate_from_empty_at_most(algorithm: str) -> None:
    """Tightened below what was used, a key is at most an empty bucket of the new limit:
    whole again one new period later, its next unit after one new interval."""
    rule = Rule("api", ["100/minute"], algorithm)
    state, _ = hits(rule.plan, None, T0, 100)
    tight = rule.plan_for((Limit.parse("3/minute"),))
    _, now = tight.algorithm.decide(tight, state, T0, 1, None, None)
    assert not now.allowed
    assert now.retry_us == 20 * S  # one token of 3/minute
    assert now.reset_us == (60 * S,)  # empty, not 100 tokens behind


@pytest.mark.parametrize("algorithm", BUCKETS)
def test_a_refused_request_leaves_the_old_state_as_it_was(algorithm: str) -> None:
    """Deciding under new limits writes nothing when refused: the stored state is the old
    one, still carried the same way later (nothing charged twice, nothing forgiven)."""
    rule = Rule("api", ["4/minute"], algorithm)
    state, _ = hits(rule.plan, None, T0, 4)
    other = rule.plan_for((Limit.parse("2/minute"),))
    new, decision = other.algorithm.decide(other, state, T0, 1, None, None)
    assert not decision.allowed
    assert new is state


@pytest.mark.parametrize("algorithm", BUCKETS)
def test_back_to_the_first_limits_the_state_carries_again(algorithm: str) -> None:
    """Written under 3/minute after 10/minute, then read under 10/minute again: the 3 units
    consumed under the tight limit count (a round trip hands out nothing)."""
    rule = Rule("api", ["10/minute"], algorithm)
    state, _ = hits(rule.plan, None, T0, 1)
    tight = rule.plan_for((Limit.parse("3/minute"),))
    state, mid = hits(tight, state, T0, 3)
    _, back = hits(rule.plan, state, T0, 10)
    assert admitted(mid) == 2  # 1 carried + 2 = 3
    assert admitted(back) == 7  # 3 carried


@pytest.mark.parametrize("algorithm", BUCKETS)
def test_a_burst_change_alone_carries_too(algorithm: str) -> None:
    """The same rate, burst 10 then 20: consumption carries (10 used, 10 left), where the
    token bucket used to keep its level (0 left) and GCRA its arrival time."""
    rule = Rule("api", ["10/minute"], algorithm, burst=10)
    state, _ = hits(rule.plan, None, T0, 10)
    wider = Rule("api", ["10/minute"], algorithm, burst=20).plan
    _, after = hits(wider, state, T0, 20)
    assert admitted(after) == 10


def test_plans_of_as_many_limits_share_a_table_and_others_do_not() -> None:
    """Where a store keeps the state: one place for every limit of the same arity (so it can
    be carried), another for a rule whose number of limits changed (started afresh)."""
    one = Rule("api", ["10/minute"], "gcra")
    assert one.plan_for((one.limits[0].parse("3/second"),)).table == one.plan.table
    two = Rule("api", ["10/minute", "100/hour"], "gcra")
    assert two.plan.table != one.plan.table


LIMITS = st.sampled_from(["1/second", "3/second", "10/minute", "7/minute", "1000/hour", "5/100ms", "2/3s"])


@settings(max_examples=150, deadline=None)
@given(
    algorithm=st.sampled_from(BUCKETS),
    first=st.lists(LIMITS, min_size=1, max_size=2, unique=True),
    second=st.lists(LIMITS, min_size=1, max_size=2, unique=True),
    burst=st.sampled_from([None, 1, 4]),
    steps=st.lists(
        st.tuples(st.booleans(), st.integers(0, 5 * S), st.integers(0, 5), st.sampled_from([None, 0, 2 * S])),
        min_size=1,
        max_size=25,
    ),
)
def test_compiled_deciders_carry_as_the_reference(
    algorithm: str, first: list[str], second: list[str], burst: int | None, steps: list[Any]
) -> None:
    """The one-limit compiled deciders (what the memory store runs) carry a state written
    under other limits exactly as the generic ``decide`` does, and never admit more than
    the limit in force allows on a fresh key at the same time."""
    plans = (Rule("r", first, algorithm, burst=burst).plan, Rule("r", second, algorithm, burst=burst).plan)
    if len(plans[0].limits) != len(plans[1].limits):
        return
    state: Any = None
    now = T0
    for which, advance, cost, max_wait in steps:
        now += advance
        plan = plans[which]
        left = plan.decide(state, now, 0, None, None)[1].remaining_each
        assert all(left[i] <= limit.capacity for i, limit in enumerate(plan.limits))
        expected_state, expected = plan.algorithm.decide(plan, state, now, cost, max_wait, None)
        got_state, got = plan.decide(state, now, cost, max_wait, None)
        assert (got_state, tuple(got)) == (expected_state, tuple(expected))
        state = got_state


def test_concurrency_leases_held_stay_held() -> None:
    """3 leases of 5, the count lowered to 2: none more until releases; raised to 4: one more."""
    rule = Rule("pool", ["5/minute"], "concurrency")
    state: Any = None
    for i in range(3):
        state, decision = rule.algo.decide(rule.plan, state, T0, 1, None, f"l{i}")
        assert decision.allowed
    lower = rule.plan_for((Limit.parse("2/minute"),))
    _, refused = lower.algorithm.decide(lower, state, T0, 1, None, "l3")
    higher = rule.plan_for((Limit.parse("4/minute"),))
    state, one = higher.algorithm.decide(higher, state, T0, 1, None, "l4")
    _, two = higher.algorithm.decide(higher, state, T0, 1, None, "l5")
    assert (refused.allowed, one.allowed, two.allowed) == (False, True, False)
    assert refused.remaining_each == (0,)
