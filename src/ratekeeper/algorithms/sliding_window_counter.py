"""Sliding window counter: the previous and the current window's counts, weighted.

State: ``(window_0, previous_0, current_0, ...)``, one triple per limit. The estimate at
``now`` is ``previous * ((period - elapsed) / period) + current``, with ``elapsed`` the
time since the current window began; a request is admitted when the estimate plus its
cost is at most the count. Approximate (it assumes the previous window's requests were
spread evenly), two numbers per limit. The float operations are written in one order
that every store repeats, so the decisions agree bit for bit.
"""

from __future__ import annotations

from math import ceil, floor
from typing import Any

from ratekeeper.algorithms.base import Algorithm, Decider, Plan, State, later
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["SlidingWindowCounter"]

_make = Decision.make


def _estimate(prev: int, curr: int, elapsed: int, period: int) -> float:
    return prev * ((period - elapsed) / period) + curr


def _window(state: State, i: int, now: int, period: int) -> int:
    """The current window: ``now``'s, or the stored one if the clock stepped back."""
    window = now // period
    if state is not None and state[3 * i] > window:
        return state[3 * i]  # type: ignore[no-any-return]
    return window


def _counts(state: State, i: int, window: int) -> tuple[int, int]:
    if state is not None:
        w = state[3 * i]
        if w == window:
            return state[3 * i + 1], state[3 * i + 2]
        if w == window - 1:
            return state[3 * i + 2], 0
    return 0, 0


def _whole_after(window: int, period: int, now: int, prev: int, curr: int) -> int:
    """µs until the estimate is 0: the current count weighs until the end of the next window."""
    if curr > 0:
        return (window + 2) * period - now
    return (window + 1) * period - now if prev > 0 else 0


def _first_admitting(prev: int, curr: int, start: int, period: int, cost: int, limit: int) -> int:
    """The first µs ``t >= start`` (inside the window beginning at ``start``) where
    ``_estimate(prev, curr, t - start) + cost <= limit``; the caller ensures one exists."""
    if prev == 0:
        return start
    elapsed = max(0, ceil(period - (limit - curr - cost) * period / prev))
    while elapsed < period and _estimate(prev, curr, elapsed, period) + cost > limit:
        elapsed += 1
    return start + elapsed


def _retry(prev: int, curr: int, start: int, period: int, cost: int, limit: int, now: int) -> int:
    """µs until a refused ``cost`` is admitted: within this window while the previous one's
    weight decays, or in the next window once this one's count becomes the previous."""
    if cost > limit:
        return INFINITE
    if curr + cost <= limit:
        return _first_admitting(prev, curr, start, period, cost, limit) - now
    return _first_admitting(curr, 0, start + period, period, cost, limit) - now


class SlidingWindowCounter(Algorithm):
    name = "sliding_window_counter"

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
        seen: list[tuple[int, int, int, float]] = []
        denied = -1
        retry = 0
        for i, (limit, period) in enumerate(specs):
            window = _window(state, i, now, period)
            prev, curr = _counts(state, i, window)
            start = window * period
            estimate = _estimate(prev, curr, now - start, period)
            if estimate + cost > limit:
                r = _retry(prev, curr, start, period, cost, limit, now)
                if denied < 0 or later(r, retry):
                    denied, retry = i, r
            seen.append((window, prev, curr, estimate))
        charged = cost if denied < 0 else 0
        remaining: list[int] = []
        resets: list[int] = []
        new: list[int] = []
        for (limit, period), (window, prev, curr, estimate) in zip(specs, seen, strict=True):
            remaining.append(max(0, floor(limit - (estimate + charged))))
            current = curr + charged
            resets.append(_whole_after(window, period, now, prev, current))
            new += (window, prev, current)
        decision = _make(plan.name, plan.limits, denied < 0, denied, retry, 0, tuple(remaining), tuple(resets))
        return (tuple(new) if charged else state), decision

    def compile_one(self, name: str, limits: tuple[Limit, ...], spec: Any) -> Decider:
        """One limit: the same operations as ``decide``, in the same order, constants bound."""
        limit, period = spec

        def decide_one(
            state: State, now: int, cost: int, max_wait: int | None = None, lease_id: str | None = None
        ) -> tuple[State, Decision]:
            window = _window(state, 0, now, period)
            prev, curr = _counts(state, 0, window)
            start = window * period
            estimate = prev * ((period - (now - start)) / period) + curr
            if estimate + cost > limit:
                retry = _retry(prev, curr, start, period, cost, limit, now)
                left = floor(limit - (estimate + 0))
                reset = _whole_after(window, period, now, prev, curr)
                return state, Decision(
                    (name, limits, False, 0, retry, 0, (left if left > 0 else 0,), (reset,), None, None)
                )
            left = floor(limit - (estimate + cost))
            current = curr + cost
            reset = _whole_after(window, period, now, prev, current)
            decision = Decision((name, limits, True, -1, 0, 0, (left if left > 0 else 0,), (reset,), None, None))
            return ((window, prev, current) if cost else state), decision

        return decide_one

    def horizon(self, plan: Plan) -> int:
        """The current window's count weighs until the end of the next window."""
        return 2 * max(limit.period_us for limit in plan.limits)

    def refund(self, plan: Plan, state: State, now: int, cost: int, lease_id: str | None = None) -> State:
        if state is None:
            return None
        new: list[int] = []
        for i, (_, period) in enumerate(plan.specs):
            window = _window(state, i, now, period)
            prev, curr = _counts(state, i, window)
            new += (window, prev, max(0, curr - cost))
        return tuple(new)
