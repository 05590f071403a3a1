"""The specialised one-limit deciders decide exactly as the reference ``decide``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper import Rule
from ratekeeper.algorithms import ALGORITHMS

steps = st.lists(
    st.tuples(
        st.sampled_from([0, 0, 1, 999, 1000, 33_333, 333_334, 1_000_000, 3_000_000, 60_000_000]),
        st.integers(min_value=0, max_value=12),
        st.sampled_from([None, None, 0, 1, 100_000, 2_000_000, 10**9]),
    ),
    min_size=1,
    max_size=60,
)
limits = st.sampled_from(["1/3s", "5/3s", "3/s", "7/100ms", "20/minute", "600 per 10 minutes", "1000/s"])


@settings(max_examples=300, deadline=None)
@given(algorithm=st.sampled_from(sorted(ALGORITHMS)), limit=limits, burst=st.sampled_from([None, 1, 2, 9]), trace=steps)
def test_compiled_decider_equals_reference(algorithm: str, limit: str, burst: int | None, trace: list) -> None:
    """Whatever ``Plan.decide`` an algorithm compiles gives the reference's state and decision."""
    if not ALGORITHMS[algorithm].uses_burst:
        burst = None
    rule = Rule("compiled", [limit], algorithm, burst=burst)
    reference, compiled = None, None
    now = 1_700_000_000_000_000
    for i, (step, cost, max_wait) in enumerate(trace):
        now += step
        lease = f"lease-{i}"
        expected_state, expected = rule.algo.decide(rule.plan, reference, now, cost, max_wait, lease)
        actual_state, actual = rule.plan.decide(compiled, now, cost, max_wait, lease)
        assert expected == actual
        assert expected_state == actual_state
        reference, compiled = expected_state, actual_state


def test_compiled_deciders_on_long_seeded_traces() -> None:
    """Long deterministic traces (seeded), where states grow far: compiled == reference, step by step."""
    import random

    rng = random.Random(1)
    for algorithm in sorted(ALGORITHMS):
        for limit in ["1/3s", "5/3s", "3/s", "7/100ms"]:
            for burst in [None, 1, 2, 9] if ALGORITHMS[algorithm].uses_burst else [None]:
                rule = Rule("long", [limit], algorithm, burst=burst)
                reference = compiled = None
                now = 10**15
                for i in range(600):
                    now += rng.choice([0, 0, 1, 1000, 50_000, 400_000, 3_000_000])
                    cost = rng.choice([0, 1, 1, 2, 3, 12])
                    max_wait = rng.choice([None, None, 0, 100_000, 5_000_000])
                    expected_state, expected = rule.algo.decide(rule.plan, reference, now, cost, max_wait, f"l{i}")
                    actual_state, actual = rule.plan.decide(compiled, now, cost, max_wait, f"l{i}")
                    assert (expected_state, expected) == (actual_state, actual), (algorithm, limit, burst, i)
                    reference, compiled = expected_state, actual_state
