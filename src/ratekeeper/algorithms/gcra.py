"""GCRA, the generic cell rate algorithm: one theoretical arrival time per limit.

Exact integer arithmetic: with ``n/d`` the reduced microseconds per unit of cost, times
are kept in units of ``1/d`` µs. A request of cost ``c`` moves the theoretical arrival
time ``tat`` to ``max(tat, now) + c*n`` and conforms when that is at most
``tau = burst*n`` past ``now``. State: per limit ``tat`` and the spec ``(n, d, capacity,
tau)`` it was written at, flat (``(tat_0, spec_0, tat_1, spec_1, ...)``), so that a plan
of other limits reads it by ``carry.carried`` (what was consumed stays consumed). The
spec is the plan's own tuple: a state written by the same plan is recognised by
identity, the cheapest test on the hot path. Decides exactly as the token bucket with the same
limits (the two are the same meter).
"""

from __future__ import annotations

from typing import Any

from ratekeeper.algorithms.base import Algorithm, Decider, Plan, State, ceil_div, rational_spec
from ratekeeper.algorithms.carry import carried
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["Gcra", "gcra_tat"]

_make = Decision.make


def gcra_tat(state: State, o: int, now: int, n: int, d: int, cap: int) -> int:
    """The theoretical arrival time of the limit whose state starts at ``state[o]``, in
    units of ``1/d`` µs and never before ``now``: as stored when it was written at this
    scale, else what it still counts carried over (``carried``)."""
    nd = now * d
    if state is None:
        return nd
    tat: int = state[o]
    n0, d0, cap0, _ = state[o + 1]
    if n0 == n and d0 == d and cap0 == cap:
        return tat if tat > nd else nd
    ahead = tat - now * d0
    if ahead <= 0:
        return nd
    return nd + carried(ahead, n0, cap, n)


def gcra_state(tats: list[int], specs: tuple[tuple[int, int, int, int], ...]) -> tuple[Any, ...]:
    """The state of these theoretical arrival times, each with its scale."""
    new: list[Any] = []
    for tat, spec in zip(tats, specs, strict=True):
        new += (tat, spec)
    return tuple(new)


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
        tats: list[int] = []
        denied = -1
        wait = 0
        infinite = False
        for i, (n, d, cap, tau) in enumerate(specs):
            nd = now * d
            tat = gcra_tat(state, 2 * i, now, n, d, cap)
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
            return (gcra_state(tats, specs) if cost else state), decision
        retry = INFINITE if infinite else wait
        return state, _make(plan.name, plan.limits, False, denied, retry, 0, tuple(remaining), tuple(resets))

    def compile_one(self, name: str, limits: tuple[Limit, ...], spec: Any) -> Decider:
        """One limit: the same arithmetic as ``decide`` with the constants bound."""
        n, d, cap, tau = spec

        def decide_one(
            state: State, now: int, cost: int, max_wait: int | None = None, lease_id: str | None = None
        ) -> tuple[State, Decision]:
            nd = now * d
            if state is None:
                tat = nd
            elif state[1] is spec:
                tat = state[0]
                if tat < nd:
                    tat = nd
            else:
                tat = gcra_tat(state, 0, now, n, d, cap)
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
                return (new, spec) if cost else state, Decision(
                    (name, limits, True, -1, 0, 0, ((tau - ahead) // n,), (-(-ahead // d),), None, None)
                )
            wait = -(-over // d)
            if max_wait is not None and wait <= max_wait:
                ahead = new - nd
                return (new, spec), Decision((name, limits, True, -1, 0, wait, (0,), (-(-ahead // d),), None, None))
            ahead = tat - nd
            remaining = (tau - ahead) // n
            return state, Decision(
                (name, limits, False, 0, wait, 0, (remaining if remaining > 0 else 0,), (-(-ahead // d),), None, None),
            )

        return decide_one

    def scale(self, plan: Plan) -> tuple[Any, ...]:
        """A state records its own scale and is carried to any other (``gcra_tat``): plans
        with as many limits share the keys' states."""
        return ("carried", len(plan.specs))

    def horizon(self, plan: Plan) -> int:
        """From empty to full: ``burst * n / d`` µs per limit (a reservation may go further)."""
        return max(ceil_div(full, d) for _, d, _, full in plan.specs)

    def refund(self, plan: Plan, state: State, now: int, cost: int, lease_id: str | None = None) -> State:
        if state is None:
            return None
        new: list[int] = []
        for i, (n, d, cap, _) in enumerate(plan.specs):
            new.append(max(now * d, gcra_tat(state, 2 * i, now, n, d, cap) - cost * n))
        return gcra_state(new, plan.specs)
