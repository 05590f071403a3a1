"""A charge without a check (``Algorithm.charge``): what a debt means for each algorithm.

A cost known only after the fact is charged whatever is left: the decision after it is
admitted, with ``remaining`` below zero while the key is in debt; the key is then refused
until time has paid the debt back. A debt is at most one limit deep (``remaining`` never
below minus the count, or the burst). Concurrency refuses a charge: its slots are leases.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper import Rule
from ratekeeper.algorithms.base import debt_charge
from ratekeeper.decision import INFINITE
from ratekeeper.errors import InvalidRequest
from ratekeeper.stores.bounds import MAX_COST

CHARGING = ("token_bucket", "gcra", "leaky_bucket", "fixed_window", "sliding_window_counter", "sliding_window_log")
NOW = 1_750_000_000_000_000  # µs, on a whole second: the fixed window begins here


def test_debt_charge_takes_all_of_the_cost_down_to_the_deepest_debt_and_no_further() -> None:
    assert debt_charge(3, 10, 10) == 3
    assert debt_charge(25, 10, 10) == 20  # remaining 10 - 20 = -10, the deepest
    assert debt_charge(5, -8, 10) == 2
    assert debt_charge(5, -10, 10) == 0
    assert debt_charge(5, -15, 10) == 0  # already past it (a limit lowered since): nothing more
    assert debt_charge(0, 10, 10) == 0


@pytest.mark.parametrize("algorithm", CHARGING)
def test_a_charge_past_what_is_left_leaves_the_key_in_debt_and_refused(algorithm: str) -> None:
    plan = Rule("debt", "10/s", algorithm=algorithm).plan
    state, first = plan.algorithm.charge(plan, None, NOW, 7)
    assert (first.allowed, first.retry_us, first.delay_us, first.remaining_each) == (True, 0, 0, (3,))
    state, second = plan.algorithm.charge(plan, state, NOW, 7)
    assert second.allowed and second.remaining_each == (-4,)
    assert second.remaining == -4  # the decision's own figure is not clamped (the headers clamp)
    _, refused = plan.decide(state, NOW, 1, None, None)
    assert not refused.allowed and refused.retry_us > 0
    assert refused.remaining_each == (0,)  # a decision that checks reports what it may still take


@pytest.mark.parametrize("algorithm", CHARGING)
def test_a_debt_is_at_most_one_limit_deep(algorithm: str) -> None:
    """Each limit on its own; the sliding log's one entry serves every limit, so it takes
    what keeps every window within twice its count (here the 10/s limit's 20)."""
    plan = Rule("deep", ["10/s", "25/min"], algorithm=algorithm).plan
    state, deep = plan.algorithm.charge(plan, None, NOW, MAX_COST)
    expected = (-10, 5) if algorithm == "sliding_window_log" else (-10, -25)
    assert deep.remaining_each == expected
    _, deeper = plan.algorithm.charge(plan, state, NOW, 1)
    assert deeper.remaining_each == expected


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra", "leaky_bucket"])
def test_a_bucket_debt_is_one_burst_deep_and_paid_back_by_the_refill(algorithm: str) -> None:
    plan = Rule("bucket", "10/s", algorithm=algorithm, burst=4).plan
    state, deep = plan.algorithm.charge(plan, None, NOW, 100)
    assert deep.remaining_each == (-4,)
    assert deep.reset_us == (800_000,)  # 8 tokens to whole at 100 ms each
    # Out of debt and one token in hand after 5 tokens' refill: 500 ms, not a µs sooner.
    assert not plan.decide(state, NOW + 499_999, 1, None, None)[1].allowed
    assert plan.decide(state, NOW + 500_000, 1, None, None)[1].allowed


def test_a_fixed_window_debt_ends_with_the_window() -> None:
    plan = Rule("window", "10/s", algorithm="fixed_window").plan
    state, deep = plan.algorithm.charge(plan, None, NOW + 250_000, 15)
    assert deep.remaining_each == (-5,) and deep.reset_us == (750_000,)
    refused = plan.decide(state, NOW + 999_999, 1, None, None)[1]
    assert not refused.allowed and refused.retry_us == 1
    assert plan.decide(state, NOW + 1_000_000, 1, None, None)[1].allowed


def test_a_sliding_window_log_debt_leaves_with_its_entry() -> None:
    plan = Rule("log", "10/s", algorithm="sliding_window_log").plan
    state, _ = plan.algorithm.charge(plan, None, NOW, 12)
    assert not plan.decide(state, NOW + 999_999, 1, None, None)[1].allowed
    assert plan.decide(state, NOW + 1_000_000, 10, None, None)[1].allowed


def test_concurrency_refuses_a_charge_with_a_clear_error() -> None:
    plan = Rule("slots", "3/min", algorithm="concurrency").plan
    with pytest.raises(InvalidRequest, match="charge without a check holds no lease"):
        plan.algorithm.charge(plan, None, NOW, 1)


@pytest.mark.parametrize("algorithm", CHARGING)
def test_a_charge_of_nothing_writes_nothing(algorithm: str) -> None:
    plan = Rule("zero", "10/s", algorithm=algorithm).plan
    state, decision = plan.algorithm.charge(plan, None, NOW, 0)
    assert state is None and decision.remaining_each == (10,) and decision.reset_us == (0,)


def logical(answer: tuple[Any, Any]) -> tuple[Any, Any]:
    """A decision with the state it leaves, the state as what it holds: a sliding log's state
    is a view of lists it may share with newer states (its module says why), so the same
    entries may sit in lists of another length."""
    state, decision = answer
    if isinstance(state, tuple) and len(state) == 5 and isinstance(state[1], list):
        base, times, totals, start, end = state
        state = (base, tuple(times[start:end]), tuple(totals[start:end]))
    return state, decision


steps = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 999, 100_000, 333_334, 1_000_000, 3_000_000]),
        st.sampled_from(["charge", "decide", "refund"]),
        st.integers(min_value=0, max_value=40),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(algorithm=st.sampled_from(CHARGING), ops=steps)
def test_a_refusal_in_debt_says_when_the_debt_is_paid_back(algorithm: str, ops: list[tuple[int, str, int]]) -> None:
    """Among charges, decisions and refunds: a refused cost is admitted exactly ``retry_us``
    later (if nothing else happens) and not a µs sooner; a charge leaves its input deciding
    as it did and answers the same for the same input; ``remaining`` never goes below the
    deepest."""
    plan = Rule("paid", ["10/s", "30/5s"], algorithm=algorithm).plan
    state: Any = None
    now = NOW
    for step, op, cost in ops:
        now += step
        if op == "charge":
            before = logical(plan.decide(state, now, 1, None, None))
            new, decision = plan.algorithm.charge(plan, state, now, cost)
            assert logical(plan.decide(state, now, 1, None, None)) == before
            assert plan.algorithm.charge(plan, state, now, cost)[1] == decision
            assert decision.remaining_each[0] >= -10 and decision.remaining_each[1] >= -30
            state = new
        elif op == "refund":
            state = plan.algorithm.refund(plan, state, now, cost)
        else:
            new, decision = plan.decide(state, now, min(cost, 10), None, None)
            if decision.allowed:
                state = new
                continue
            assert decision.retry_us != INFINITE
            assert plan.decide(state, now + decision.retry_us, min(cost, 10), None, None)[1].allowed
            assert not plan.decide(state, now + decision.retry_us - 1, min(cost, 10), None, None)[1].allowed
