"""Sliding window log: the times (and costs) of admitted requests.

A request at ``now`` is admitted when, for every limit, the cost admitted at times
``t > now - period`` plus its own cost is at most the count: an entry admitted at ``t``
counts until ``t + period``. One log serves every limit of the rule. Exact for any
window; memory grows with the count.

State: ``(base, times, totals, start, end)``, a view of two append-only lists:
``times[start:end]`` are the admission times (ascending) and ``totals[k]`` the
cumulative cost admitted up to and including entry ``k``; ``base`` is the cumulative
cost before entry ``start``. Usage in a window is then one binary search. The lists
are shared between successive states and only ever appended to, so an older state
(a view ending earlier) still reads exactly what it held: an admission appends in place
when the state is the newest view of its lists and copies the live entries otherwise.
Expired entries are skipped by moving ``start`` and compacted away once they are the
larger part. A charge without a check (``charge``) appends its cost whatever a window
holds, so a window may hold more than its count (at most twice it, for every limit): the
key is refused until enough of it has left the windows.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any

from ratekeeper.algorithms.base import Decider, Plan, State, debt_charge
from ratekeeper.algorithms.per_limit import PerLimit, combined
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["SlidingWindowLog"]


def _live(longest: int, state: State, now: int) -> tuple[int, list[int], list[int], int, int]:
    """``(base, times, totals, start, end)`` with ``start`` moved past what no limit counts."""
    if state is None:
        return 0, [], [], 0, 0
    base: int = state[0]
    times: list[int] = state[1]
    totals: list[int] = state[2]
    start: int = state[3]
    end: int = state[4]
    first = bisect_right(times, now - longest, start, end)
    return (totals[first - 1] if first > start else base), times, totals, first, end


def _append(base: int, times: list[int], totals: list[int], live: int, end: int, stamp: int, total: int) -> State:
    """The state with an entry at ``stamp`` bringing the cumulative cost to ``total``."""
    if end != len(times) or (live > 32 and 2 * live > end):
        # Not the newest view of these lists (or mostly expired): copy what is live.
        times, totals, end, live = times[live:end], totals[live:end], end - live, 0
    times.append(stamp)
    totals.append(total)
    return base, times, totals, live, end + 1


def _decider(name: str, limits: tuple[Limit, ...], spec: tuple[int, int], record: bool) -> Decider:
    """The decider of one limit: with ``record``, an admitted cost is appended to the log;
    without, the state is returned as it is (the decision is the same)."""
    limit, period = spec

    def decide_one(
        state: State, now: int, cost: int, max_wait: int | None = None, lease_id: str | None = None
    ) -> tuple[State, Decision]:
        base, times, totals, live, end = _live(period, state, now)  # the live entries are this window's
        total = totals[end - 1] if end > live else base
        used = total - base
        if used + cost > limit:
            if cost > limit:
                retry = INFINITE
            else:
                # The entry whose expiry frees enough: cumulative cost reaches the excess.
                retry = times[bisect_left(totals, total + cost - limit, live, end)] + period - now
            left = limit - used  # below 0 under a limit lowered since
            reset = times[end - 1] + period - now if used > 0 else 0
            return state, Decision((name, limits, False, 0, retry, 0, (left if left > 0 else 0,), (reset,), None, None))
        if not cost:
            reset = times[end - 1] + period - now if used > 0 else 0
            return state, Decision((name, limits, True, -1, 0, 0, (limit - used,), (reset,), None, None))
        # A clock that stepped back must not break the order: the entry then counts a little longer.
        stamp = now if end == live or now > times[end - 1] else times[end - 1]
        if record:
            state = _append(base, times, totals, live, end, stamp, total + cost)
        used += cost
        return state, Decision((name, limits, True, -1, 0, 0, (limit - used,), (stamp + period - now,), None, None))

    return decide_one


class SlidingWindowLog(PerLimit):
    name = "sliding_window_log"
    width = 0

    def scale(self, plan: Plan) -> tuple[Any, ...]:
        """Absolute times and costs: a state means the same under any limits."""
        return ()

    def compile_one(self, name: str, limits: tuple[Limit, ...], spec: Any) -> Decider:
        """Admitted when the cost the window holds plus ``cost`` is at most the count."""
        return _decider(name, limits, spec, record=True)

    def compile(self, plan: Plan) -> Decider:
        """Several limits look at the one log; an admitted cost is one entry for all of them,
        kept as long as the longest window counts it."""
        if len(plan.specs) == 1:
            return self.compile_one(plan.name, plan.limits, plan.specs[0])
        pairs = zip(plan.limits, plan.specs, strict=True)
        looks = tuple(_decider(plan.name, (limit,), spec, record=False) for limit, spec in pairs)
        longest = max(period for _, period in plan.specs)

        def charge(state: State, now: int, cost: int) -> State:
            base, times, totals, live, end = _live(longest, state, now)
            total = totals[end - 1] if end > live else base
            stamp = now if end == live or now > times[end - 1] else times[end - 1]
            return _append(base, times, totals, live, end, stamp, total + cost)

        return combined(plan, looks, 0, charge)

    def charge(self, plan: Plan, state: State, now: int, cost: int) -> tuple[State, Decision]:
        """Append ``cost`` whatever the windows hold: as much of it as keeps every limit's
        window within twice its count (``Algorithm.charge``)."""
        base, times, totals, live, end = _live(max(period for _, period in plan.specs), state, now)
        total = totals[end - 1] if end > live else base
        used = [total - _live(period, state, now)[0] for _, period in plan.specs]
        taken = cost
        for (limit, _), u in zip(plan.specs, used, strict=True):
            taken = min(taken, debt_charge(cost, limit - u, limit))
        stamp = None
        if end > live:
            stamp = times[end - 1]
        if taken:
            stamp = now if stamp is None or now > stamp else stamp
            state = _append(base, times, totals, live, end, stamp, total + taken)
        remaining = tuple(limit - u - taken for (limit, _), u in zip(plan.specs, used, strict=True))
        resets = tuple(
            stamp + period - now if u + taken > 0 and stamp is not None else 0
            for (_, period), u in zip(plan.specs, used, strict=True)
        )
        return state, Decision((plan.name, plan.limits, True, -1, 0, 0, remaining, resets, None, None))

    def refund(self, plan: Plan, state: State, now: int, cost: int, lease_id: str | None = None) -> State:
        """Take ``cost`` back from the newest entries."""
        base, times, totals, live, end = _live(max(period for _, period in plan.specs), state, now)
        if end <= live:
            return None
        target = totals[end - 1] - cost
        if target <= base:
            return None
        k = bisect_left(totals, target, live, end)  # the first entry whose total reaches the target
        kept_totals = totals[live:k]
        kept_totals.append(target)
        return base, times[live : k + 1], kept_totals, 0, k + 1 - live
