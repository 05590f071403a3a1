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

from ratekeeper.algorithms.base import Decider, State
from ratekeeper.algorithms.gcra import Gcra, gcra_tat
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = ["LeakyBucket"]


class LeakyBucket(Gcra):
    """Shares GCRA's state, spec and refund; differs in when a request may leave."""

    name = "leaky_bucket"

    def compile_one(self, name: str, limits: tuple[Limit, ...], spec: Any) -> Decider:
        """Admitted when the queue has room for ``cost`` and, under ``max_wait``, is short
        enough; the delay is what is queued ahead."""
        n, d, cap, tau = spec

        def decide_one(
            state: State, now: int, cost: int, max_wait: int | None = None, lease_id: str | None = None
        ) -> tuple[State, Decision]:
            nd = now * d
            tat = nd if state is None else state[0] if state[1] is spec else gcra_tat(state, now, n, d, cap)
            if tat < nd:
                tat = nd
            queued = -((nd - tat) // d)
            if cost > cap:
                retry = INFINITE
            else:
                # The later of: room in the queue, and a queue short enough for max_wait.
                retry = -((nd + tau - tat - cost * n) // d)
                if max_wait is not None and queued - max_wait > retry:
                    retry = queued - max_wait
            if retry > 0 or cost > cap:  # refused (INFINITE is -1: never)
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
