"""Fixed window: a counter per aligned window of ``period``.

State: ``(window_0, count_0, window_1, count_1, ...)``, one pair per limit, where a
window is ``now // period``. Exact inside each window; up to twice the limit can pass
around a boundary. The cheapest algorithm.
"""

from __future__ import annotations

from typing import Any

from ratekeeper.algorithms.base import Algorithm, Decider, Plan, State, later
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["FixedWindow"]

_make = Decision.make


class FixedWindow(Algorithm):
    name = "fixed_window"

    def spec(self, name: str, limit: Limit) -> tuple[int, int]:
        return limit.count, limit.period_us

    def decide(
        self,
        plan: Plan,
        state: State,
        now: int,
        cost: int,
        max_wait: int | None = None,
        lease_id: str | None = None,
    ) -> tuple[State, Decision]:
        specs = plan.specs
        counts: list[int] = []
        ends: list[int] = []
        windows: list[int] = []
        denied = -1
        retry = 0
        for i, (limit, period) in enumerate(specs):
            window = now // period
            if state is not None and state[2 * i] > window:
                window = state[2 * i]  # the clock stepped back: stay in the newer window
            count = state[2 * i + 1] if state is not None and state[2 * i] == window else 0
            end = (window + 1) * period - now
            if count + cost > limit:
                r = INFINITE if cost > limit else end
                if denied < 0 or later(r, retry):
                    denied, retry = i, r
            counts.append(count)
            ends.append(end)
            windows.append(window)
        charged = cost if denied < 0 else 0
        # A count above a limit that was lowered since (a reload, a quota) has nothing left.
        remaining = tuple(max(0, spec[0] - c - charged) for spec, c in zip(specs, counts, strict=True))
        resets = tuple(e if c + charged > 0 else 0 for e, c in zip(ends, counts, strict=True))
        decision = _make(plan.name, plan.limits, denied < 0, denied, retry, 0, remaining, resets)
        if charged:
            new: list[int] = []
            for w, c in zip(windows, counts, strict=True):
                new += (w, c + charged)
            state = tuple(new)
        return state, decision

    def compile_one(self, name: str, limits: tuple[Limit, ...], spec: Any) -> Decider:
        """One limit: the same arithmetic as ``decide`` with the constants bound."""
        limit, period = spec

        def decide_one(
            state: State, now: int, cost: int, max_wait: int | None = None, lease_id: str | None = None
        ) -> tuple[State, Decision]:
            window = now // period
            if state is not None and state[0] >= window:
                window = state[0]  # the same window, or the clock stepped back: stay in the newer one
                count = state[1]
            else:
                count = 0
            end = (window + 1) * period - now
            total = count + cost
            if total <= limit:
                if cost:
                    state = (window, total)
                return state, Decision(
                    (name, limits, True, -1, 0, 0, (limit - total,), (end if total else 0,), None, None)
                )
            retry = INFINITE if cost > limit else end
            return state, Decision(
                (name, limits, False, 0, retry, 0, (max(0, limit - count),), (end if count else 0,), None, None)
            )

        return decide_one

    def refund(self, plan: Plan, state: State, now: int, cost: int, lease_id: str | None = None) -> State:
        if state is None:
            return None
        new: list[Any] = list(state)
        for i, (_, period) in enumerate(plan.specs):
            if new[2 * i] >= now // period:
                new[2 * i + 1] = max(0, new[2 * i + 1] - cost)
        return tuple(new)
