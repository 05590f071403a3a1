"""Token bucket: ``burst`` tokens, refilled continuously at ``count`` per ``period``.

Exact integer arithmetic: with ``n/d`` the reduced microseconds per token, a token is
``n`` units and the bucket gains ``d`` units per microsecond. State: per limit
``(level, last, spec)``, flat, with the level in units after the last refill at ``last``
(µs) and the spec ``(n, d, capacity, full)`` it was written at (the plan's own tuple,
recognised by identity on the hot path), so that a plan of other limits carries what was
consumed (``carry.carried``). The level goes below zero through reservations made by
``acquire`` (``max_wait`` > 0), where the caller then waits until its tokens exist, and
through a charge without a check (``charge``): the key is in debt, refused until the
refill brings the level back to what a request needs; never below ``-full`` (one
capacity of debt).
"""

from __future__ import annotations

from typing import Any

from ratekeeper.algorithms.base import Decider, State, ceil_div, debt_charge
from ratekeeper.algorithms.bucket import Bucket, deepest_debt
from ratekeeper.algorithms.carry import carried
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["TokenBucket"]


class TokenBucket(Bucket):
    name = "token_bucket"
    width = 3

    @staticmethod
    def _level(state: State, now: int, spec: tuple[int, int, int, int]) -> int:
        """The level at ``now`` in the units of ``spec``: refilled at the scale the state
        was written at, then carried to this one when it differs."""
        n, d, cap, full = spec
        if state is None:
            return full
        level: int = state[0]
        n0, d0, _, full0 = state[2]
        elapsed = now - state[1]
        if elapsed > 0:
            level = full0 if elapsed >= ceil_div(full0 - level, d0) else level + elapsed * d0
        if n0 == n and d0 == d and full0 == full:
            return level
        if level >= full0:
            return full
        return full - carried(full0 - level, n0, cap, n)

    def compile_one(self, name: str, limits: tuple[Limit, ...], spec: Any) -> Decider:
        """Admitted when the bucket holds ``cost`` tokens, or (a reservation) when the wait
        until it does fits in ``max_wait``: the level then goes below zero."""
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
                level = level_of(state, now, spec)
                # A clock that stepped back never moves the refill point back (no double refill).
                last = now if now > state[1] else state[1]
            need = cost * n
            wait = 0 if level >= need else -((level - need) // d)
            if cost <= cap and (wait == 0 or (max_wait is not None and wait <= max_wait)):
                level -= need
                left = level // n  # below 0 past a reservation
                return (level, last, spec) if cost else state, Decision(
                    (
                        name,
                        limits,
                        True,
                        -1,
                        0,
                        wait,
                        (left if left > 0 else 0,),
                        (-((level - full) // d) if level < full else 0,),
                        None,
                        None,
                    )
                )
            retry = INFINITE if cost > cap else wait
            left = level // n
            return state, Decision(
                (
                    name,
                    limits,
                    False,
                    0,
                    retry,
                    0,
                    (left if left > 0 else 0,),
                    (-((level - full) // d) if level < full else 0,),
                    None,
                    None,
                )
            )

        return decide_one

    def charge_one(self, spec: Any, part: State, now: int, cost: int) -> tuple[State, int, int]:
        """Take ``cost`` tokens whatever the level: it may go below zero, down to ``-full``
        (``deepest_debt``)."""
        n, d, cap, full = spec
        level = self._level(part, now, spec)
        taken = debt_charge(cost, level // n, deepest_debt(n, cap, full))
        if cost:  # a part written at the plan's scale, as an admission writes it
            level -= taken * n
            part = level, now if part is None or now > part[1] else part[1], spec
        return part, level // n, -((level - full) // d) if level < full else 0

    def refund_one(self, spec: Any, part: State, now: int, cost: int) -> State:
        n, _, _, full = spec
        last = part[1]
        return min(full, self._level(part, now, spec) + cost * n), now if now > last else last, spec
