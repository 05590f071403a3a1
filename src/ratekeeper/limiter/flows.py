"""The waiting logic of ``acquire`` and ``lease``, written once, run by sync and async shells.

A flow is a generator that yields what to do (an ``Op`` for the store, DECIDE or REFUND,
or a ``Sleep``) and receives the results; the limiter (``_run_flow``) does them with its
store and its clock. The flow decides what to do;
the shells only do it (the psycopg pattern).
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ratekeeper.algorithms.base import UNBOUNDED_WAIT
from ratekeeper.errors import RateLimitExceeded
from ratekeeper.op import Op

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.clock import Clock
    from ratekeeper.decision import Decision

__all__ = ["Flow", "Sleep", "acquire_flow"]

T = TypeVar("T")

POLL_FIRST = 0.001
POLL_MAX = 0.05


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Flow = Generator[Op | Sleep, Any, T]


def acquire_flow(
    plan: Plan, key: str, cost: int, timeout: float | None, clock: Clock, lease_id: str | None
) -> Flow[Decision]:
    """Admit ``cost`` within ``timeout`` seconds (None: as long as it takes), or raise.

    Token bucket, GCRA and leaky bucket reserve their slot in one store call and sleep
    until it (first come, first served across every process); a reservation the caller
    would not wait for is never made. Other algorithms sleep until ``retry_after`` (or
    poll with backoff, for leases that can be released early) and ask again. Interrupted
    while sleeping on a reservation, the flow gives the reservation back.
    """
    algorithm = plan.algorithm
    start = clock.now_us()
    deadline = None if timeout is None else start + round(timeout * 1_000_000)
    poll = POLL_FIRST
    while True:
        # a timeout of centuries waits as long as it takes: max_wait stays within what stores hold
        left = UNBOUNDED_WAIT if deadline is None else min(UNBOUNDED_WAIT, max(0, deadline - clock.now_us()))
        decision: Decision = yield Op.decide(plan, key, cost, left if algorithm.reserves else None, lease_id)
        if decision.allowed:
            if decision.delay_us > 0:
                try:
                    yield Sleep(decision.delay)
                except BaseException:
                    yield Op.refund(plan, key, cost, lease_id)
                    raise
            return decision
        retry = decision.retry_after
        if math.isinf(retry):
            raise RateLimitExceeded(decision, cost=cost)
        if algorithm.reserves and algorithm.waiting_cannot_help(decision, left):
            raise RateLimitExceeded(decision, f"{_why(decision)}; not admitted within the timeout of {timeout}s")
        if algorithm.uses_leases:
            retry = min(retry, poll)
            poll = min(poll * 2, POLL_MAX)
        if deadline is not None:
            left = deadline - clock.now_us()
            if algorithm.uses_leases and 0 < left < round(retry * 1_000_000):
                retry = left / 1_000_000  # a lease may be released meanwhile: one last look at the deadline
            elif round(retry * 1_000_000) > left:
                raise RateLimitExceeded(decision, f"{_why(decision)}; not admitted within the timeout of {timeout}s")
        yield Sleep(retry)


def _why(decision: Decision) -> str:
    return f"rate limited by {decision.denied_by} of rule {decision.rule!r}"
