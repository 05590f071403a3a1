"""Leaky bucket as a queue: admits with a delay, for shaping outgoing calls.

Requests join a queue that drains at ``count`` per ``period``; the queue holds at most
``burst`` (default ``count``) units of cost. An admitted request gets ``delay``: the
time until the requests ahead of it have drained, so admitted requests leave evenly
spaced, never in a burst. A full queue refuses. State as GCRA's: per limit the time (in
``1/d`` µs) at which the queue is empty, with the scale it was written at (a plan of
other limits carries what is still queued: ``gcra.gcra_tat``).

``max_wait`` bounds the delay the caller will accept (``acquire``'s timeout): a longer
delay is refused, with ``retry_us`` the time until the queue is short enough (and has
room). ``try_acquire`` passes None: any delay that fits in the queue.
"""

from __future__ import annotations

from typing import Any

from ratekeeper.algorithms.base import Decider, Plan, State, ceil_div
from ratekeeper.algorithms.gcra import Gcra, gcra_state, gcra_tat
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["LeakyBucket"]

_make = Decision.make


class LeakyBucket(Gcra):
    """Shares GCRA's state, spec and refund; differs in when a request may leave."""

    name = "leaky_bucket"

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
        retry = 0
        delay = 0
        infinite = False
        for i, (n, d, cap, tau) in enumerate(specs):
            nd = now * d
            tat = gcra_tat(state, 2 * i, now, n, d, cap)
            tats.append(tat)
            queued = ceil_div(tat - nd, d)
            if queued > delay:
                delay = queued
            if cost > cap:
                if not infinite:
                    infinite, denied, retry = True, i, INFINITE
                continue
            # The request needs room in the queue and, when the caller bounds its wait,
            # a queue short enough: the later of the two is when it could be admitted.
            need = ceil_div(tat + cost * n - nd - tau, d)
            if max_wait is not None and queued - max_wait > need:
                need = queued - max_wait
            if need > 0 and not infinite and need > retry:
                denied, retry = i, need
        allowed = denied < 0
        if allowed and cost:
            tats = [tat + cost * spec[0] for tat, spec in zip(tats, specs, strict=True)]
        remaining: list[int] = []
        resets: list[int] = []
        for tat, (n, d, _, tau) in zip(tats, specs, strict=True):
            ahead = tat - now * d
            remaining.append(max(0, (tau - ahead) // n))
            resets.append(ceil_div(ahead, d))
        if allowed:
            decision = _make(plan.name, plan.limits, True, -1, 0, delay, tuple(remaining), tuple(resets))
            return (gcra_state(tats, specs) if cost else state), decision
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
            queued = -((nd - tat) // d)
            if cost > cap:
                retry = INFINITE
            else:
                retry = -((nd + tau - tat - cost * n) // d)  # when the queue has room: <= 0 now
                if max_wait is not None and queued - max_wait > retry:
                    retry = queued - max_wait
            if retry > 0 or cost > cap:
                ahead = tat - nd
                left = (tau - ahead) // n
                return state, Decision(
                    (name, limits, False, 0, retry, 0, (left if left > 0 else 0,), (-(-ahead // d),), None, None)
                )
            if cost:
                tat += cost * n
            ahead = tat - nd
            left = (tau - ahead) // n
            decision = Decision(
                (name, limits, True, -1, 0, queued, (left if left > 0 else 0,), (-(-ahead // d),), None, None)
            )
            return ((tat, spec) if cost else state), decision

        return decide_one

    def waiting_cannot_help(self, decision: Decision, max_wait: int) -> bool:
        """A queue longer than ``max_wait`` shrinks as fast as the caller's time left; a
        full queue with a short enough wait is worth waiting for."""
        return any(queued > max_wait for queued in decision.reset_us)
