"""GCRA, the generic cell rate algorithm: one theoretical arrival time per limit.

Exact integer arithmetic: with ``n/d`` the reduced microseconds per unit of cost, times
are kept in units of ``1/d`` µs. A request of cost ``c`` moves the theoretical arrival
time ``tat`` to ``max(tat, now) + c*n`` and conforms when that is at most
``tau = burst*n`` past ``now``. State: the ``tat`` (an int) for a one-limit rule, a tuple
of them otherwise. Decides exactly as the token bucket with the same limits (the two are
the same meter), in one number.
"""

from __future__ import annotations

from typing import Any

from ratekeeper.algorithms.base import Algorithm, Decider, Plan, State, ceil_div, rational_spec
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["Gcra"]

_make = Decision.make


class Gcra(Algorithm):
    name = "gcra"
    reserves = True
    uses_burst = True

    def spec(self, name: str, limit: Limit) -> tuple[int, int, int, int]:
        n, d, cap = rational_spec(name, limit)
        return n, d, cap, cap * n

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
        single = len(specs) == 1
        tats: list[int] = []
        denied = -1
        wait = 0
        infinite = False
        for i, (n, d, cap, tau) in enumerate(specs):
            nd = now * d
            tat = nd if state is None else (state if single else state[i])
            if tat < nd:
                tat = nd
            tats.append(tat)
            if cost > cap:
                if not infinite:
                    infinite, denied = True, i
                continue
            over = tat + cost * n - nd - tau
            if over > 0:
                w = ceil_div(over, d)
                if w > wait:
                    wait = w
                    if not infinite:
                        denied = i
        allowed = not infinite and wait <= (max_wait or 0)
        if allowed and cost:
            tats = [tat + cost * spec[0] for tat, spec in zip(tats, specs, strict=True)]
        remaining: list[int] = []
        resets: list[int] = []
        for tat, (n, d, _, tau) in zip(tats, specs, strict=True):
            ahead = tat - now * d
            remaining.append(max(0, (tau - ahead) // n))
            resets.append(ceil_div(ahead, d))
        if allowed:
            decision = _make(plan.name, plan.limits, True, -1, 0, wait, tuple(remaining), tuple(resets))
            return ((tats[0] if single else tuple(tats)) if cost else state), decision
        retry = INFINITE if infinite else wait
        return state, _make(plan.name, plan.limits, False, denied, retry, 0, tuple(remaining), tuple(resets))

    def compile_one(self, name: str, limits: tuple[Limit, ...], spec: Any) -> Decider:
        """One limit: the same arithmetic as ``decide`` with the constants bound."""
        n, d, cap, tau = spec

        def decide_one(
            state: State, now: int, cost: int, max_wait: int | None = None, lease_id: str | None = None
        ) -> tuple[State, Decision]:
            nd = now * d
            tat = nd if state is None or state < nd else state
            new = tat + cost * n
            over = new - nd - tau
            if cost > cap:
                ahead = tat - nd
                remaining = (tau - ahead) // n
                return state, Decision(
                    (
                        name,
                        limits,
                        False,
                        0,
                        INFINITE,
                        0,
                        (remaining if remaining > 0 else 0,),
                        (-(-ahead // d),),
                        None,
                        None,
                    ),
                )
            if over <= 0:
                ahead = new - nd
                return new if cost else state, Decision(
                    (name, limits, True, -1, 0, 0, ((tau - ahead) // n,), (-(-ahead // d),), None, None)
                )
            wait = -(-over // d)
            if max_wait is not None and wait <= max_wait:
                ahead = new - nd
                return new, Decision((name, limits, True, -1, 0, wait, (0,), (-(-ahead // d),), None, None))
            ahead = tat - nd
            remaining = (tau - ahead) // n
            return state, Decision(
                (name, limits, False, 0, wait, 0, (remaining if remaining > 0 else 0,), (-(-ahead // d),), None, None),
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
        single = len(plan.specs) == 1
        new: list[int] = []
        for i, (n, d, _, _) in enumerate(plan.specs):
            tat = state if single else state[i]
            new.append(max(now * d, tat - cost * n))
        return new[0] if single else tuple(new)
