"""Sliding window counter: the previous and the current window's counts, weighted.

State: ``(window_0, previous_0, current_0, ...)``, one triple per limit. The count at
``now`` is the current window's count plus the previous window's weighted by the part of
it the sliding window still covers, rounded down::

    counted = current + floor(previous * (period - elapsed) / period)

with ``elapsed`` the time since the current window began; a request is admitted when
``counted + cost`` is at most the limit's count. This is the convention of the
system-design chapter this library follows: limit 7 per minute, 5 requests in the
previous minute and 3 in the current one, a request 30 % into the minute counts
``3 + floor(5 x 0.7) = 3 + floor(3.5) = 6`` and is admitted (6 + 1 <= 7); the next one
counts ``4 + 3 = 7`` and is refused. Approximate (it assumes the previous window's
requests were spread evenly), two numbers per limit, and exact integer arithmetic, which
every store repeats (Lua with an exact multiply-divide, PostgreSQL in ``numeric``). A
charge without a check (``charge``) may bring the count past the limit (at most to twice
it): the key is refused until the windows' weights bring it back under.
"""

from __future__ import annotations

from typing import Any

from ratekeeper.algorithms.base import Decider, Plan, State, debt_charge
from ratekeeper.algorithms.per_limit import PerLimit
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["SlidingWindowCounter"]


def _window(state: State, now: int, period: int) -> int:
    """The current window: ``now``'s, or the stored one if the clock stepped back."""
    window = now // period
    if state is not None and state[0] > window:
        return state[0]  # type: ignore[no-any-return]
    return window


def _counts(state: State, window: int) -> tuple[int, int]:
    """The previous and the current window's counts."""
    if state is not None:
        w = state[0]
        if w == window:
            return state[1], state[2]
        if w == window - 1:
            return state[2], 0
    return 0, 0


def _whole_after(window: int, period: int, now: int, prev: int, curr: int) -> int:
    """µs until nothing is counted: a count ``c`` of the window before counts
    ``floor(c * (period - e) / period)``, which is 0 from ``e = period + 1 - ceil(period / c)``
    on; so the current count weighs into the next window, the previous one into this."""
    if curr > 0:
        return (window + 2) * period + 1 - (-(-period // curr)) - now
    if prev > 0:
        return max(0, (window + 1) * period + 1 - (-(-period // prev)) - now)
    return 0


def _first_admitting(prev: int, curr: int, start: int, period: int, cost: int, limit: int) -> int:
    """The first µs ``t >= start`` (inside the window beginning at ``start``) where
    ``curr + floor(prev * (period - (t - start)) / period) + cost <= limit``; the caller ensures one exists
    (``curr + cost <= limit``).

    With ``x = limit - curr - cost >= 0``: ``floor(prev * (period - e) / period) <= x``
    holds exactly when ``prev * (period - e) < (x + 1) * period``, so the first such
    ``e`` is ``period + 1 - ceil((x + 1) * period / prev)`` (at least 0).
    """
    x = limit - curr - cost
    if x >= prev:  # the whole previous count fits already
        return start
    return start + period + 1 - (-(-(x + 1) * period // prev))


def _retry(prev: int, curr: int, start: int, period: int, cost: int, limit: int, now: int) -> int:
    """µs until a refused ``cost`` is admitted: within this window while the previous one's
    weight decays, or in the next window once this one's count becomes the previous."""
    if cost > limit:
        return INFINITE
    if curr + cost <= limit:
        return _first_admitting(prev, curr, start, period, cost, limit) - now
    return _first_admitting(curr, 0, start + period, period, cost, limit) - now


class SlidingWindowCounter(PerLimit):
    name = "sliding_window_counter"
    width = 3

    def compile_one(self, name: str, limits: tuple[Limit, ...], spec: Any) -> Decider:
        """Admitted when the weighted count plus ``cost`` is at most the limit."""
        limit, period = spec

        def decide_one(
            state: State, now: int, cost: int, max_wait: int | None = None, lease_id: str | None = None
        ) -> tuple[State, Decision]:
            window = _window(state, now, period)
            prev, curr = _counts(state, window)
            start = window * period
            elapsed = now - start
            # What the window holds (the previous count whole when the clock stepped back before it).
            counted = curr + prev * (period - elapsed) // period if elapsed > 0 else curr + prev
            if counted + cost > limit:
                retry = _retry(prev, curr, start, period, cost, limit, now)
                left = limit - counted
                reset = _whole_after(window, period, now, prev, curr)
                return state, Decision(
                    (name, limits, False, 0, retry, 0, (left if left > 0 else 0,), (reset,), None, None)
                )
            left = limit - (counted + cost)
            current = curr + cost
            reset = _whole_after(window, period, now, prev, current)
            decision = Decision((name, limits, True, -1, 0, 0, (left if left > 0 else 0,), (reset,), None, None))
            return ((window, prev, current) if cost else state), decision

        return decide_one

    def horizon(self, plan: Plan) -> int:
        """The current window's count weighs until the end of the next window."""
        return 2 * max(limit.period_us for limit in plan.limits)

    def charge_one(self, spec: Any, part: State, now: int, cost: int) -> tuple[State, int, int]:
        """Count ``cost`` in the current window whatever the count: up to twice the limit."""
        limit, period = spec
        window = _window(part, now, period)
        prev, curr = _counts(part, window)
        elapsed = now - window * period
        counted = curr + prev * (period - elapsed) // period if elapsed > 0 else curr + prev
        taken = debt_charge(cost, limit - counted, limit)
        if cost:  # a part written at the plan's scale, as an admission writes it
            curr += taken
            part = window, prev, curr
        return part, limit - counted - taken, _whole_after(window, period, now, prev, curr)

    def refund_one(self, spec: Any, part: State, now: int, cost: int) -> State:
        window = _window(part, now, spec[1])
        prev, curr = _counts(part, window)
        return window, prev, max(0, curr - cost)
