"""Run a request's transaction (``transaction``), or a flow around one, against a ``Limiter``.

Generated from ``drive_async.py`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, TypeVar

from ratekeeper.limiter.acompat import gather
from ratekeeper.limiter.transaction import Call, Outcome, Peek, Step, transaction

if TYPE_CHECKING:
    from ratekeeper.decision import BatchDecision, Decision
    from ratekeeper.limiter.limiter import Limiter
    from ratekeeper.limiter.transaction import Entry

__all__ = ["drive", "run_transaction"]

T = TypeVar("T")


def run_transaction(limiter: Limiter, entries: Sequence[Entry]) -> Outcome:
    """The transaction of ``entries`` (``transaction``)."""
    return drive(limiter, transaction(entries))


def drive(limiter: Limiter, flow: Generator[Step, Sequence[BatchDecision | Decision], T]) -> T:
    """Run a flow that yields ``Step``s (a ``transaction``, or a caller's flow around one);
    the calls of one step do not depend on each other (with asyncio they run concurrently)."""
    try:
        step = next(flow)
        while True:
            step = flow.send(gather(*(_call(limiter, call) for call in step)))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _call(limiter: Limiter, call: Call) -> BatchDecision | Decision:
    if isinstance(call, Peek):
        return limiter.peek(call.rule, call.key, call.cost)
    return limiter.try_acquire_many(call.items)
