"""Token bucket: ``burst`` tokens, refilled continuously at ``count`` per ``period``.

Exact integer arithmetic: with ``n/d`` the reduced microseconds per token, a token is
``n`` units and the bucket gains ``d`` units per microsecond. State:
``(level_0, last_0, level_1, last_1, ...)`` with the level in units after the last
refill at ``last`` (µs). The level goes below zero only through reservations made by
``acquire`` (``max_wait`` > 0): the caller then waits until its tokens exist.
"""

from __future__ import annotations

from typing import Any

from ratekeeper.algorithms.base import Algorithm, Decider, Plan, State, ceil_div, rational_spec
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["TokenBucket"]

_make = Decision.make


class TokenBucket(Algorithm):
    name = "token_bucket"
    reserves = True
    uses_burst = True

    def spec(self, name: str, limit: Limit) -> tuple[int, int, int, int]:
        n, d, cap = rational_spec(name, limit)
        return n, d, cap, cap * n

    @staticmethod
    def _level(state: State, i: int, now: int, d: int, full: int) -> int:
        if state is None:
            return full
        level: int = state[2 * i]
        last: int = state[2 * i + 1]
        elapsed = now - last
        if elapsed <= 0:
            return level
        if elapsed >= ceil_div(full - level, d):
            return full
        return level + elapsed * d

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
        levels: list[int] = []
        denied = -1
        wait = 0
        infinite = False
        for i, (n, d, cap, full) in enumerate(specs):
            level = self._level(state, i, now, d, full)
            levels.append(level)
            if cost > cap:
                if not infinite:
                    infinite, denied = True, i
                continue
            need = cost * n
            if level < need:
                w = ceil_div(need - level, d)
                if w > wait:
                    wait = w
                    if not infinite:
                        denied = i
        allowed = not infinite and wait <= (max_wait or 0)
        if allowed:
            denied = -1
        if allowed and cost:
            levels = [level - cost * spec[0] for level, spec in zip(levels, specs, strict=True)]
        remaining = tuple(max(0, level // spec[0]) for level, spec in zip(levels, specs, strict=True))
        resets = tuple(
            ceil_div(spec[3] - level, spec[1]) if level < spec[3] else 0
            for level, spec in zip(levels, specs, strict=True)
        )
        if allowed and not cost:
            return state, _make(plan.name, plan.limits, True, -1, 0, wait, remaining, resets)
        if allowed:
            decision = _make(plan.name, plan.limits, True, -1, 0, wait, remaining, resets)
            new: list[int] = []
            for i, level in enumerate(levels):
                # A clock that stepped back never moves the refill point back (no double refill).
                new += (level, now if state is None or now > state[2 * i + 1] else state[2 * i + 1])
            return tuple(new), decision
        retry = INFINITE if infinite else wait
        return state, _make(plan.name, plan.limits, False, denied, retry, 0, remaining, resets)

    def compile_one(self, name: str, limits: tuple[Limit, ...], spec: Any) -> Decider:
        """One limit: the same arithmetic as ``decide`` with the constants bound."""
        n, d, cap, full = spec

        def decide_one(
            state: State, now: int, cost: int, max_wait: int | None = None, lease_id: str | None = None
        ) -> tuple[State, Decision]:
            if state is None:
                level = full
                last = now
            else:
                level, last = state
                elapsed = now - last
                if elapsed > 0:
                    level = full if elapsed >= -((level - full) // d) else level + elapsed * d
                    last = now
            need = cost * n
            if cost > cap:
                return state, Decision(
                    (
                        name,
                        limits,
                        False,
                        0,
                        INFINITE,
                        0,
                        ((level // n) if level > 0 else 0,),
                        (-((level - full) // d),),
                        None,
                        None,
                    ),
                )
            wait = 0 if level >= need else -((level - need) // d)
            if wait == 0 or (max_wait is not None and wait <= max_wait):
                level -= need
                return (level, last) if cost else state, Decision(
                    (
                        name,
                        limits,
                        True,
                        -1,
                        0,
                        wait,
                        ((level // n) if level > 0 else 0,),
                        (-((level - full) // d),),
                        None,
                        None,
                    ),
                )
            return state, Decision(
                (
                    name,
                    limits,
                    False,
                    0,
                    wait,
                    0,
                    ((level // n) if level > 0 else 0,),
                    (-((level - full) // d),),
                    None,
                    None,
                ),
            )

        return decide_one

    def scale(self, plan: Plan) -> tuple[Any, ...]:
        """Times (or levels) are counted in units of ``1/d`` µs (or ``n`` per token) per limit."""
        return tuple((n, d) for n, d, _, _ in plan.specs)

    def horizon(self, plan: Plan) -> int:
        """From empty to full: ``burst * n / d`` µs per limit (a reservation may go further)."""
        return max(ceil_div(full, d) for _, d, _, full in plan.specs)

    def refund(self, plan: Plan, state: State, now: int, cost: int, lease_id: str | None = None) -> State:
        if state is None:
            return None
        new: list[int] = []
        for i, (n, d, _, full) in enumerate(plan.specs):
            last = state[2 * i + 1]
            new += (min(full, self._level(state, i, now, d, full) + cost * n), now if now > last else last)
        return tuple(new)
