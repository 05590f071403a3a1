"""GCRA, the generic cell rate algorithm: one theoretical arrival time per limit.

Exact integer arithmetic: with ``n/d`` the reduced microseconds per unit of cost, times
are kept in units of ``1/d`` µs. A request of cost ``c`` moves the theoretical arrival
time ``tat`` to ``max(tat, now) + c*n`` and conforms when that is at most
``tau = burst*n`` past ``now``. State: per limit ``tat`` and the spec ``(n, d, capacity,
tau)`` it was written at, flat (``(tat_0, spec_0, tat_1, spec_1, ...)``), so that a plan
of other limits reads it by ``carry.carried`` (what was consumed stays consumed). The
spec is the plan's own tuple: a state written by the same plan is recognised by
identity, the cheapest test on the hot path. Decides exactly as the token bucket with the same
limits (the two are the same meter). A charge without a check (``charge``) moves ``tat``
beyond ``tau``: the key is in debt until time catches up, never more than ``tau`` beyond
(one burst of debt).
"""

from __future__ import annotations

from typing import Any

from ratekeeper.algorithms.base import Decider, State, debt_charge
from ratekeeper.algorithms.bucket import Bucket, deepest_debt
from ratekeeper.algorithms.carry import carried
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["Gcra", "gcra_tat"]


def gcra_tat(state: State, now: int, n: int, d: int, cap: int) -> int:
    """The theoretical arrival time of a limit's state ``(tat, spec)``, in units of
    ``1/d`` µs and never before ``now``: as stored when it was written at this scale,
    else what it still counts carried over (``carried``)."""
    nd = now * d
    if state is None:
        return nd
    tat: int = state[0]
    n0, d0, cap0, _ = state[1]
    if n0 == n and d0 == d and cap0 == cap:
        return tat if tat > nd else nd
    ahead = tat - now * d0
    if ahead <= 0:
        return nd
    return nd + carried(ahead, n0, cap, n)


class Gcra(Bucket):
    name = "gcra"
    width = 2

    def compile_one(self, name: str, limits: tuple[Limit, ...], spec: Any) -> Decider:
        """Admitted when ``tat + cost*n`` is at most ``tau`` past ``now``, or (a reservation)
        when the wait until it is fits in ``max_wait``."""
        n, d, cap, tau = spec

        def decide_one(
            state: State, now: int, cost: int, max_wait: int | None = None, lease_id: str | None = None
        ) -> tuple[State, Decision]:
            nd = now * d
            tat = nd if state is None else state[0] if state[1] is spec else gcra_tat(state, now, n, d, cap)
            if tat < nd:
                tat = nd
            new = tat + cost * n
            over = new - nd - tau
            wait = 0 if over <= 0 else -(-over // d)  # until the request conforms
            if wait == 0 or (max_wait is not None and wait <= max_wait and cost <= cap):
                ahead = new - nd
                left = (tau - ahead) // n  # below 0 past a reservation
                return (new, spec) if cost else state, Decision(
                    (name, limits, True, -1, 0, wait, (left if left > 0 else 0,), (-(-ahead // d),), None, None)
                )
            ahead = tat - nd
            left = (tau - ahead) // n
            retry = INFINITE if cost > cap else wait
            return state, Decision(
                (name, limits, False, 0, retry, 0, (left if left > 0 else 0,), (-(-ahead // d),), None, None)
            )

        return decide_one

    def charge_one(self, spec: Any, part: State, now: int, cost: int) -> tuple[State, int, int]:
        """Move ``tat`` by ``cost`` whatever it is: it may pass ``tau``, up to ``2 * tau``
        (``deepest_debt``)."""
        n, d, cap, tau = spec
        nd = now * d
        tat = gcra_tat(part, now, n, d, cap)
        taken = debt_charge(cost, (tau - tat + nd) // n, deepest_debt(n, cap, tau))
        if cost:  # a part written at the plan's scale, as an admission writes it
            tat += taken * n
            part = tat, spec
        ahead = tat - nd
        return part, (tau - ahead) // n, -(-ahead // d)

    def refund_one(self, spec: Any, part: State, now: int, cost: int) -> State:
        n, d, cap, _ = spec
        return max(now * d, gcra_tat(part, now, n, d, cap) - cost * n), spec
