"""Sliding window log: the times (and costs) of admitted requests.

State: ``(base, times, totals)``: ``times`` ascending, one entry per distinct admission
time; ``totals[k]`` the cumulative cost admitted up to and including ``times[k]``, and
``base`` the cumulative cost before ``times[0]``. One log serves every limit of the
rule; entries older than the longest period are dropped. A request at ``now`` is
admitted when, for every limit, the cost of entries with ``t > now - period`` plus its
own cost is at most the count; an entry admitted at ``t`` counts until ``t + period``.
Exact for any window. The cumulative totals make each limit's usage one binary search,
so a decision costs O(log n) steps plus one copy of the log.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from ratekeeper.algorithms.base import Algorithm, Plan, State, later
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["SlidingWindowLog"]

_make = Decision.make
_EMPTY: tuple[int, tuple[int, ...], tuple[int, ...]] = (0, (), ())


def _live(plan: Plan, state: State, now: int) -> tuple[int, tuple[int, ...], tuple[int, ...], int]:
    """``(base, times, totals, first)``: ``first`` is the oldest entry any limit still counts,
    ``base`` the cumulative cost before it (entries before it are dropped on the next write)."""
    if state is None:
        return 0, (), (), 0
    times: tuple[int, ...] = state[1]
    totals: tuple[int, ...] = state[2]
    first = bisect_right(times, now - max(period for _, period in plan.specs))
    return (totals[first - 1] if first else state[0]), times, totals, first


class SlidingWindowLog(Algorithm):
    name = "sliding_window_log"

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
        base, times, totals, live = _live(plan, state, now)
        total = totals[-1] if totals else base
        starts: list[int] = []
        denied = -1
        retry = 0
        for i, (limit, period) in enumerate(plan.specs):
            first = bisect_right(times, now - period, live)  # oldest entry inside this window
            before = totals[first - 1] if first > live else base
            used = total - before
            starts.append(used)
            if used + cost > limit:
                if cost > limit:
                    r = INFINITE
                else:
                    # The entry whose expiry frees enough: cumulative cost reaches the excess.
                    k = bisect_left(totals, before + used + cost - limit, first)
                    r = times[k] + period - now
                if denied < 0 or later(r, retry):
                    denied, retry = i, r
        charged = cost if denied < 0 else 0
        newest = times[-1] if len(times) > live else now
        if charged:
            if len(times) > live and newest == now:
                times, totals = times[live:], (*totals[live:-1], total + cost)
            else:
                times, totals = (*times[live:], now), (*totals[live:], total + cost)
            state = (base, times, totals)
            newest = now
        remaining: list[int] = []
        resets: list[int] = []
        for (limit, period), used in zip(plan.specs, starts, strict=True):
            in_window = used + charged
            remaining.append(limit - in_window)
            resets.append(newest + period - now if in_window > 0 else 0)
        decision = _make(plan.name, plan.limits, denied < 0, denied, retry, 0, tuple(remaining), tuple(resets))
        return state, decision

    def refund(self, plan: Plan, state: State, now: int, cost: int, lease_id: str | None = None) -> State:
        """Take ``cost`` back from the newest entries."""
        base, times, totals, live = _live(plan, state, now)
        if len(times) <= live:
            return None
        target = totals[-1] - cost
        if target <= base:
            return None
        k = bisect_left(totals, target, live)  # the first entry whose total reaches the target
        return base, times[live : k + 1], (*totals[live:k], target)
