"""Sliding window log: the timestamps (and costs) of admitted requests.

State: ``(t_0, cost_0, t_1, cost_1, ...)`` in ascending time, one log for every limit
of the rule (entries older than the longest period are dropped). A request at ``now``
is admitted when, for every limit, the cost of entries with ``t > now - period`` plus
its own cost is at most the count. An entry admitted at ``t`` counts until
``t + period``. Exact for any window; memory grows with the limit.
"""

from __future__ import annotations

from ratekeeper.algorithms.base import Algorithm, Plan, State, later
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["SlidingWindowLog"]

_make = Decision.make


class SlidingWindowLog(Algorithm):
    name = "sliding_window_log"

    def spec(self, name: str, limit: Limit) -> tuple[int, int]:
        return limit.count, limit.period_us

    @staticmethod
    def _live(plan: Plan, state: State, now: int) -> tuple[int, ...]:
        if not state:
            return ()
        horizon = now - max(p for _, p in plan.specs)
        k = 0
        n = len(state)
        while k < n and state[k] <= horizon:
            k += 2
        live: tuple[int, ...] = state if k == 0 else state[k:]
        return live

    def decide(
        self,
        plan: Plan,
        state: State,
        now: int,
        cost: int,
        max_wait: int | None = None,
        lease_id: str | None = None,
    ) -> tuple[State, Decision]:
        log = self._live(plan, state, now)
        n = len(log)
        useds: list[int] = []
        denied = -1
        retry = 0
        for i, (limit, period) in enumerate(plan.specs):
            cutoff = now - period
            used = 0
            j = n - 2
            while j >= 0 and log[j] > cutoff:
                used += log[j + 1]
                j -= 2
            useds.append(used)
            if used + cost > limit:
                if cost > limit:
                    r = INFINITE
                else:
                    need = used + cost - limit
                    k = j + 2  # oldest entry inside this window
                    while True:
                        need -= log[k + 1]
                        if need <= 0:
                            break
                        k += 2
                    r = log[k] + period - now
                if denied < 0 or later(r, retry):
                    denied, retry = i, r
        newest = log[n - 2] if n else None
        if denied < 0 and cost > 0:
            log = (*log[: n - 1], log[n - 1] + cost) if n and log[n - 2] == now else (*log, now, cost)
            newest = now
            charged = cost
        else:
            charged = 0
        remaining: list[int] = []
        resets: list[int] = []
        for (limit, period), used in zip(plan.specs, useds, strict=True):
            total = used + charged
            remaining.append(limit - total)
            resets.append(newest + period - now if total > 0 and newest is not None else 0)
        decision = _make(plan.name, plan.limits, denied < 0, denied, retry, 0, tuple(remaining), tuple(resets))
        return (log or None), decision

    def refund(self, plan: Plan, state: State, now: int, cost: int, lease_id: str | None = None) -> State:
        log = list(self._live(plan, state, now))
        while cost > 0 and log:
            take = min(cost, log[-1])
            cost -= take
            if take == log[-1]:
                del log[-2:]
            else:
                log[-1] -= take
        return tuple(log) or None
