"""Run a request's transaction (``transaction``), or a flow around one, against an
``AsyncLimiter``: the flow decides what to do; this only does it.

This module is the source of ``drive.py`` (the same for ``Limiter``): ``tools/unasync.py``
writes it, and a test fails when the two differ. Edit this one, then run
``python tools/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, TypeVar

from ratekeeper.limiter.acompat import agather
from ratekeeper.limiter.transaction import Call, Outcome, Peek, Step, transaction

if TYPE_CHECKING:
    from ratekeeper.decision import BatchDecision, Decision
    from ratekeeper.limiter.limiter_async import AsyncLimiter
    from ratekeeper.limiter.transaction import Entry

__all__ = ["drive", "run_transaction"]

T = TypeVar("T")


async def run_transaction(limiter: AsyncLimiter, entries: Sequence[Entry]) -> Outcome:
    """The transaction of ``entries`` (``transaction``)."""
    return await drive(limiter, transaction(entries))


async def drive(limiter: AsyncLimiter, flow: Generator[Step, Sequence[BatchDecision | Decision], T]) -> T:
    """Run a flow that yields ``Step``s (a ``transaction``, or a caller's flow around one);
    the calls of one step do not depend on each other (with asyncio they run concurrently)."""
    try:
        step = next(flow)
        while True:
            step = flow.send(await agather(*(_call(limiter, call) for call in step)))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def _call(limiter: AsyncLimiter, call: Call) -> BatchDecision | Decision:
    if isinstance(call, Peek):
        return await limiter.peek(call.rule, call.key, call.cost)
    return await limiter.try_acquire_many(call.items)
