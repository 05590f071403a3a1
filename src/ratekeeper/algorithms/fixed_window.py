"""Fixed window: a counter per aligned window of ``period``.

State: ``(window_0, count_0, window_1, count_1, ...)``, one pair per limit, where a
window is ``now // period``. Exact inside each window; up to twice the limit can pass
around a boundary. The cheapest algorithm. A charge without a check (``charge``) may bring
the count past the limit (at most to twice it): the key is refused until the window ends.
"""

from __future__ import annotations

from typing import Any

from ratekeeper.algorithms.base import Decider, State, debt_charge
from ratekeeper.algorithms.per_limit import PerLimit
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["FixedWindow"]


class FixedWindow(PerLimit):
    name = "fixed_window"
    width = 2

    def compile_one(self, name: str, limits: tuple[Limit, ...], spec: Any) -> Decider:
        """Admitted when the window's count plus ``cost`` is at most the limit."""
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
            # A count above a limit that was lowered since (a reload, a quota) has nothing left.
            return state, Decision(
                (name, limits, False, 0, retry, 0, (max(0, limit - count),), (end if count else 0,), None, None)
            )

        return decide_one

    def charge_one(self, spec: Any, part: State, now: int, cost: int) -> tuple[State, int, int]:
        """Count ``cost`` in the current window whatever the count: up to twice the limit."""
        limit, period = spec
        window = now // period
        count = 0
        if part is not None and part[0] >= window:
            window, count = part
        taken = debt_charge(cost, limit - count, limit)
        if cost:  # a part written at the plan's scale, as an admission writes it
            count += taken
            part = window, count
        return part, limit - count, (window + 1) * period - now if count else 0

    def refund_one(self, spec: Any, part: State, now: int, cost: int) -> State:
        window, count = part
        return (window, max(0, count - cost)) if window >= now // spec[1] else part
