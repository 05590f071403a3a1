"""Token bucket: ``burst`` tokens, refilled continuously at ``count`` per ``period``.

Exact integer arithmetic: with ``n/d`` the reduced microseconds per token, a token is
``n`` units and the bucket gains ``d`` units per microsecond. State: per limit
``(level, last, spec)``, flat, with the level in units after the last refill at ``last``
(µs) and the spec ``(n, d, capacity, full)`` it was written at (the plan's own tuple,
recognised by identity on the hot path), so that a plan of other limits carries what was
consumed (``carry.carried``). The level goes below zero only through
reservations made by ``acquire`` (``max_wait`` > 0): the caller then waits until its
tokens exist.
"""

from __future__ import annotations

from typing import Any

from ratekeeper.algorithms.base import Algorithm, Decider, Plan, State, ceil_div, rational_spec
from ratekeeper.algorithms.carry import carried
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
    def _level(state: State, i: int, now: int, spec: tuple[int, int, int, int]) -> int:
        """Limit ``i``'s level at ``now`` in this plan's units: refilled at the scale the
        state was written at, then carried to this one when it differs."""
        n, d, cap, full = spec
        if state is None:
            return full
        o = 3 * i
        level: int = state[o]
        n0, d0, _, full0 = state[o + 2]
        elapsed = now - state[o + 1]
        if elapsed > 0:
            level = full0 if elapsed >= ceil_div(full0 - level, d0) else level + elapsed * d0
        if n0 == n and d0 == d and full0 == full:
            return level
        if level >= full0:
            return full
        return full - carried(full0 - level, n0, cap, n)

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
        for i, spec in enumerate(specs):
            n, d, cap, _ = spec
            level = self._level(state, i, now, spec)
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
            new: list[Any] = []
            for i, level in enumerate(levels):
                # A clock that stepped back never moves the refill point back (no double refill).
                new += (level, now if state is None or now > state[3 * i + 1] else state[3 * i + 1], specs[i])
            return tuple(new), decision
        retry = INFINITE if infinite else wait
        return state, _make(plan.name, plan.limits, False, denied, retry, 0, remaining, resets)

    def compile_one(self, name: str, limits: tuple[Limit, ...], spec: Any) -> Decider:
        """One limit: the same arithmetic as ``decide`` with the constants bound."""
        n, d, cap, full = spec
        level_of = self._level

        def decide_one(
            state: State, now: int, cost: int, max_wait: int | None = None, lease_id: str | None = None
        ) -> tuple[State, Decision]:
            if state is None:
                level = full
                last = now
            elif state[2] is spec:
                level, last = state[0], state[1]
                elapsed = now - last
                if elapsed > 0:
                    level = full if elapsed >= -((level - full) // d) else level + elapsed * d
                    last = now
            else:
                level = level_of(state, 0, now, spec)
                last = now if now > state[1] else state[1]
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
                return (level, last, spec) if cost else state, Decision(
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
        """A state records its own scale and is carried to any other (``_level``): plans
        with as many limits share the keys' states."""
        return ("carried", len(plan.specs))

    def horizon(self, plan: Plan) -> int:
        """From empty to full: ``burst * n / d`` µs per limit (a reservation may go further)."""
        return max(ceil_div(full, d) for _, d, _, full in plan.specs)

    def refund(self, plan: Plan, state: State, now: int, cost: int, lease_id: str | None = None) -> State:
        if state is None:
            return None
        new: list[Any] = []
        for i, spec in enumerate(plan.specs):
            n, _, _, full = spec
            last = state[3 * i + 1]
            new += (min(full, self._level(state, i, now, spec) + cost * n), now if now > last else last, spec)
        return tuple(new)
