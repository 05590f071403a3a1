"""A rule of several limits decides as its limits would one by one, as one transaction.

Admitted when every limit admits, with each limit's own figures and the longest delay;
refused otherwise, by the limit whose retry is latest (the first of those), each limit
then telling of its state as it is (what its own rule answers for cost 0). Nothing is
charged unless every limit admits. This holds for every algorithm: those that decide
limit by limit (``per_limit.combined``) and those whose one state serves every limit
(sliding window log, concurrency).
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper import Rule
from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.decision import INFINITE

steps = st.lists(
    st.tuples(
        st.sampled_from([0, 0, 1, 999, 1000, 33_333, 333_334, 1_000_000, 3_000_000, 60_000_000]),
        st.integers(min_value=0, max_value=12),
        st.sampled_from([None, None, 0, 1, 100_000, 2_000_000, 10**9]),
    ),
    min_size=1,
    max_size=60,
)
limits = st.lists(
    st.sampled_from(["1/3s", "5/3s", "3/s", "7/100ms", "20/minute", "600 per 10 minutes", "1000/s"]),
    min_size=2,
    max_size=3,
)


def latest(retry_us: int) -> float:
    return math.inf if retry_us == INFINITE else retry_us


@settings(max_examples=300, deadline=None)
@given(algorithm=st.sampled_from(sorted(ALGORITHMS)), texts=limits, burst=st.sampled_from([None, 1, 2, 9]), trace=steps)
def test_several_limits_decide_as_their_limits_one_by_one(
    algorithm: str, texts: list[str], burst: int | None, trace: list[tuple[int, int, int | None]]
) -> None:
    if not ALGORITHMS[algorithm].uses_burst:
        burst = None
    rule = Rule("several", texts, algorithm, burst=burst)
    ones = [Rule("several", [text], algorithm, burst=burst) for text in texts]
    state: Any = None
    states: list[Any] = [None] * len(ones)
    now = 1_700_000_000_000_000
    for i, (step, cost, max_wait) in enumerate(trace):
        now += step
        lease = f"lease-{i}"
        state, decision = rule.algo.decide(rule.plan, state, now, cost, max_wait, lease)
        pairs = list(zip(ones, states, strict=True))
        answers = [one.algo.decide(one.plan, s, now, cost, max_wait, lease) for one, s in pairs]
        if all(answer.allowed for _, answer in answers):
            assert decision.allowed
            assert (decision.denied_index, decision.retry_us) == (-1, 0)
            assert decision.delay_us == max(answer.delay_us for _, answer in answers)
            each = [answer for _, answer in answers]
            states = [s for s, _ in answers]
        else:
            refused = [(k, answer.retry_us) for k, (_, answer) in enumerate(answers) if not answer.allowed]
            assert not decision.allowed
            assert (decision.denied_index, decision.retry_us) == max(refused, key=lambda kr: latest(kr[1]))
            assert decision.delay_us == 0
            each = [one.algo.decide(one.plan, s, now, 0, None, None)[1] for one, s in pairs]
        assert decision.remaining_each == tuple(answer.remaining_each[0] for answer in each)
        assert decision.reset_us == tuple(answer.reset_us[0] for answer in each)
