"""The redundant-limit warning is sound: a limit it names never changes a decision.

For random pairs of limits that ``redundant_limits`` flags, a rule with both limits and a
rule with the other limit alone admit exactly the same requests of a random trace.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper import Limit, Limiter, Rule
from ratekeeper.config.checks import redundant_limits
from ratekeeper.testing import FakeClock

ALGORITHMS = ["fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "gcra", "leaky_bucket"]


@st.composite
def flagged_pairs(draw: st.DrawFn) -> tuple[Limit, Limit]:
    a = Limit(draw(st.integers(1, 4)), draw(st.integers(1, 3)))
    period = a.period * draw(st.integers(1, 4)) + draw(st.sampled_from([0, 0.5, 1]))
    windows = -(-round(period * 1000) // round(a.period * 1000))  # ceil(b.period / a.period)
    b = Limit(a.count * windows + draw(st.integers(0, 2)), period)
    return a, b


@settings(max_examples=150, deadline=None)
@given(
    pair=flagged_pairs(),
    algorithm=st.sampled_from(ALGORITHMS),
    gaps=st.lists(st.integers(0, 1500), min_size=5, max_size=60),
    burst=st.sampled_from([None, 1, 3]),
)
def test_a_flagged_limit_never_changes_a_decision(
    pair: tuple[Limit, Limit], algorithm: str, gaps: list[int], burst: int | None
) -> None:
    a, b = pair
    if algorithm in ("token_bucket", "gcra", "leaky_bucket") and burst is not None:
        # A rule's burst raises what passes A; then B is flagged only when it still cannot bind.
        if redundant_limits([a, b], burst) != [(b, a)]:
            return
    else:
        burst = None
        assert redundant_limits([a, b]) == [(b, a)]
    both, alone = Rule("both", [a, b], algorithm, burst=burst), Rule("alone", [a], algorithm, burst=burst)
    clock = FakeClock()
    limiter = Limiter("memory://", clock=clock)
    now = clock.now_us()
    for gap in gaps:
        now += gap * 1_000
        assert bool(limiter.try_acquire(both, "k", now=now)) == bool(limiter.try_acquire(alone, "k", now=now)), (
            a,
            b,
            algorithm,
        )
    limiter.close()
