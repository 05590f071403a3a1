"""A store clock that steps back (Redis ``TIME`` after a failover, NTP) never lets more through.

Every trace here feeds ``decide`` times that sometimes go backwards; the bounds are then
checked on the effective timeline: each admission at the latest time the store has
recorded so far (by writing a state), which is the best any store can know.
"""

from __future__ import annotations

from fractions import Fraction

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ratekeeper import Rule

deltas = st.lists(
    st.tuples(st.integers(min_value=-2_000_000, max_value=2_000_000), st.integers(min_value=0, max_value=3)),
    min_size=1,
    max_size=80,
)


def run(rule: Rule, trace: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(effective time, cost) of every admitted request."""
    state = None
    now = 10_000_000_000
    effective = 0
    admitted = []
    for delta, cost in trace:
        now += delta
        new, decision = rule.plan.decide(state, now, cost, None, f"lease-{len(admitted)}")
        if new is not state:  # the store records this time (an admission, or expired entries dropped)
            effective = max(effective, now)
        if decision.allowed and cost:
            admitted.append((effective, cost))
        state = new
    return admitted


@settings(max_examples=200, deadline=None)
@given(trace=deltas)
@example(trace=[(0, 3), (-1, 2), (2_999_999, 1), (1, 1)])  # an entry appended out of order
def test_sliding_log_holds_its_limit_in_every_window_of_effective_time(trace: list[tuple[int, int]]) -> None:
    """At most 5 in any 3 s of effective time, however the clock jumps."""
    admitted = run(Rule("back", ["5/3s"], "sliding_window_log"), trace)
    for t, _ in admitted:
        assert sum(c for u, c in admitted if t <= u < t + 3_000_000) <= 5


@settings(max_examples=200, deadline=None)
@given(trace=deltas, algorithm=st.sampled_from(["token_bucket", "gcra", "leaky_bucket"]))
@example(trace=[(0, 2), (-500_000, 1), (500_000, 1)], algorithm="token_bucket")  # would refill 0.5 s twice
def test_buckets_never_refill_twice_for_the_same_time(algorithm: str, trace: list[tuple[int, int]]) -> None:
    """Admitted cost over any span of effective time stays within burst + rate * span."""
    admitted = run(Rule("back", ["2/s"], algorithm, burst=3), trace)
    for i, (t0, _) in enumerate(admitted):
        total = 0
        for t1, cost in admitted[i:]:
            total += cost
            assert total <= 3 + Fraction(2 * (t1 - t0), 1_000_000)


@settings(max_examples=200, deadline=None)
@given(trace=deltas)
def test_fixed_window_never_reopens_an_old_window(trace: list[tuple[int, int]]) -> None:
    """At most 4 per aligned 2 s window of effective time."""
    admitted = run(Rule("back", ["4/2s"], "fixed_window"), trace)
    windows: dict[int, int] = {}
    for t, cost in admitted:
        windows[t // 2_000_000] = windows.get(t // 2_000_000, 0) + cost
    assert all(count <= 4 for count in windows.values())


@settings(max_examples=200, deadline=None)
@given(trace=deltas)
def test_concurrency_never_exceeds_its_leases(trace: list[tuple[int, int]]) -> None:
    """At most 3 leases (by cost) alive at any effective time; leases live 5 s."""
    admitted = run(Rule("back", ["3/5s"], "concurrency"), trace)
    for t, _ in admitted:
        assert sum(c for u, c in admitted if u <= t < u + 5_000_000) <= 3
