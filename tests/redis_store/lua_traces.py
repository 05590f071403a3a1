"""Random traces through one Lua algorithm against its Python reference (tests' helper).

The conformance suite (tests/conformance) runs every store through hypothesis traces;
these seeded traces are each Lua file's own quick check, at epoch µs near 2^53 and across
a clock that steps back, through refunds, peeks, reservations and charges without a check
(into debt, and past the deepest debt).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from refund_reference import refund_as_stores

from ratekeeper import Rule
from ratekeeper.op import DECIDE, PEEK, Op

__all__ = ["assert_traces_match"]


def assert_traces_match(
    store: Any,
    algorithm: str,
    *,
    seed: int,
    limit_sets: Sequence[Sequence[str]],
    starts: Sequence[int],
    steps: Sequence[int],
    bursts: Sequence[int | None] = (None,),
    max_waits: Sequence[int | None] = (None,),
    trials: int = 12,
    length: int = 40,
) -> None:
    """Run ``trials`` traces of ``length`` ops on keys "a" and "b"; every decision must equal
    the reference's (a refund that leaves a state whole forgets it, as every store does)."""
    rng = random.Random(seed)
    for trial in range(trials):
        burst = rng.choice(list(bursts))
        plan = Rule(f"{algorithm}-{trial}", list(rng.choice(list(limit_sets))), algorithm=algorithm, burst=burst).plan
        now = rng.choice(list(starts))
        states: dict[str, Any] = {}
        for _ in range(length):
            now += rng.choice(list(steps))
            key, cost = rng.choice("ab"), rng.randint(0, 6)
            if rng.random() < 0.15:
                store.refund(Op.refund(plan, key, cost), now)
                states[key] = refund_as_stores(plan, states.get(key), now, cost)
                continue
            if rng.random() < 0.15:
                cost = rng.choice((cost, rng.randint(0, 40)))
                states[key], expected = plan.algorithm.charge(plan, states.get(key), now, cost)
                assert store.decide(Op.charge(plan, key, cost), now) == expected, (trial, now, key, cost, "charge")
                continue
            max_wait = rng.choice(list(max_waits))
            commit = rng.random() > 0.2
            new, expected = plan.decide(states.get(key), now, cost, max_wait, None)
            if commit:
                states[key] = new
            assert store.decide(Op((DECIDE if commit else PEEK, plan, key, cost, max_wait, None)), now) == expected, (
                trial,
                now,
                key,
                cost,
            )
