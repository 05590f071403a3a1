"""Concurrency: at most ``count`` leases in flight; a lease expires after ``period``.

State: ``(lease_id_0, acquired_0, cost_0, ...)`` in the order acquired. A lease counts
for a limit until ``acquired + period``, so the leases of a crashed holder free
themselves. ``refund`` with the lease id releases it early (``Lease.release``).
``retry_us`` is when enough leases expire at the latest; a release can free them sooner.
"""

from __future__ import annotations

from typing import Any

from ratekeeper.algorithms.base import Algorithm, Decider, Plan, State, later
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.errors import InvalidRequest

__all__ = ["Concurrency"]


class Concurrency(Algorithm):
    name = "concurrency"
    uses_leases = True

    def scale(self, plan: Plan) -> tuple[Any, ...]:
        """Absolute times and costs: a state means the same under any limits."""
        return ()

    @staticmethod
    def _live(plan: Plan, state: State, now: int) -> tuple[Any, ...]:
        if not state:
            return ()
        horizon = now - max(p for _, p in plan.specs)
        k = 0
        n = len(state)
        while k < n and state[k + 1] <= horizon:
            k += 3
        live: tuple[Any, ...] = state if k == 0 else state[k:]
        return live

    def charge(self, plan: Plan, state: State, now: int, cost: int) -> tuple[State, Decision]:
        """Refused: a slot is held by a lease and given back by its release, so a charge
        without a check (no lease, nothing to release) would hold slots no one can free."""
        raise InvalidRequest(
            f"rule {plan.name!r} limits concurrency: a charge without a check holds no lease, so it means "
            "nothing there; take a lease (try_acquire, acquire or lease) instead"
        )

    def compile(self, plan: Plan) -> Decider:
        """Admitted when, for every limit, the leases it counts plus ``cost`` are at most the
        count; the lease is recorded once for all of them."""
        live_of = self._live

        def decide(
            state: State, now: int, cost: int, max_wait: int | None = None, lease_id: str | None = None
        ) -> tuple[State, Decision]:
            leases = live_of(plan, state, now)
            n = len(leases)
            useds: list[int] = []
            denied = -1
            retry = 0
            for i, (limit, period) in enumerate(plan.specs):
                cutoff = now - period
                used = 0
                first = n
                for j in range(n - 3, -1, -3):
                    if leases[j + 1] <= cutoff:
                        break
                    used += leases[j + 2]
                    first = j
                useds.append(used)
                if used + cost > limit:
                    if cost > limit:
                        r = INFINITE
                    else:
                        need = used + cost - limit
                        k = first
                        while True:
                            need -= leases[k + 2]
                            if need <= 0:
                                break
                            k += 3
                        r = leases[k + 1] + period - now
                    if denied < 0 or later(r, retry):
                        denied, retry = i, r
            charged = 0
            if denied < 0 and cost > 0:
                # Leases stay in order of acquisition even if the clock stepped back.
                leases = (*leases, lease_id, max(now, leases[-2]) if leases else now, cost)
                charged = cost
            remaining: list[int] = []
            resets: list[int] = []
            newest = leases[-2] if leases else now
            for (limit, period), used in zip(plan.specs, useds, strict=True):
                total = used + charged
                remaining.append(max(0, limit - total))  # more held than a count lowered since: 0
                resets.append(newest + period - now if total > 0 else 0)
            decision = Decision(
                (
                    plan.name,
                    plan.limits,
                    denied < 0,
                    denied,
                    retry,
                    0,
                    tuple(remaining),
                    tuple(resets),
                    lease_id if charged else None,
                    None,
                )
            )
            return (leases or None), decision

        return decide

    def refund(self, plan: Plan, state: State, now: int, cost: int, lease_id: str | None = None) -> State:
        """Release the lease ``lease_id`` (``cost`` is ignored: a lease is released whole)."""
        if lease_id is None:
            raise InvalidRequest("releasing a concurrency lease needs its lease_id")
        leases = self._live(plan, state, now)
        for j in range(0, len(leases), 3):
            if leases[j] == lease_id:
                return (leases[:j] + leases[j + 3 :]) or None
        return leases or None

    @staticmethod
    def holds(state: State, lease_id: str) -> bool:
        return bool(state) and lease_id in state[0::3]
