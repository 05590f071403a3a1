"""A coalescing queue that announces what happens to it, so a test waits for the event it
needs (ops queued, a call taken) instead of sleeping or counting event-loop turns.

Threads wait on a Condition (``wait_queued``); a task awaits ``until``, whose future is
resolved by the push, withdrawal or take that makes its condition true (the queue of an
asyncio driver is only touched on the loop's thread). Every wait is bounded by ``BOUND``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from ratekeeper.stores.coalescing import Coalescer

BOUND = 5.0
"""The longest any wait on the queue may take."""


class ObservedCoalescer(Coalescer[Any, Any]):
    """A ``Coalescer`` that tells when ops are queued, withdrawn or taken for a call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.changed = threading.Condition()
        self.pushed = 0
        """Ops queued so far."""
        self.taken = 0
        """Calls taken from the queue so far."""
        self._waiting: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []

    @classmethod
    def like(cls, core: Coalescer[Any, Any]) -> ObservedCoalescer:
        """An empty observed queue with ``core``'s settings."""
        return cls(core.max_in_flight, core.max_batch, core.row, core.busy is not None, core.spread)

    def push(self, op: Any, now: int | None, waiter: Any) -> None:
        with self.changed:
            super().push(op, now, waiter)
            self.pushed += 1
            self._announce()

    def withdraw(self, waiter: Any) -> bool:
        with self.changed:
            withdrawn = super().withdraw(waiter)
            self._announce()
            return withdrawn

    def take(self) -> Any:
        with self.changed:
            call = super().take()
            if call is not None:
                self.taken += 1
                self._announce()
            return call

    def _announce(self) -> None:
        self.changed.notify_all()
        still = []
        for condition, future in self._waiting:
            if future.done():
                continue
            if condition():
                future.set_result(None)
            else:
                still.append((condition, future))
        self._waiting = still

    def wait_queued(self, n: int) -> None:
        """Block this thread until exactly ``n`` ops are queued."""
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.queue) == n, BOUND), f"{n} ops were never queued"

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        """Wait, in the loop that drives this queue, until a change of the queue makes
        ``condition()`` true."""
        if condition():
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiting.append((condition, future))

        def expire() -> None:
            if not future.done():
                future.set_exception(AssertionError(f"{what} never happened"))

        # Awaited directly (not through wait_for, which adds a hop): the waiting task runs
        # before any callback the change that resolved it scheduled after it.
        timer = loop.call_later(BOUND, expire)
        try:
            await future
        finally:
            timer.cancel()

    async def queued(self, n: int) -> None:
        """Wait until exactly ``n`` ops are queued."""
        await self.until(lambda: len(self.queue) == n, f"{n} ops queued")


async def finished(*tasks: asyncio.Future[Any]) -> None:
    """Wait until every one of ``tasks`` is done (cancelled ones included), within ``BOUND``."""
    _, pending = await asyncio.wait(tasks, timeout=BOUND)
    assert not pending, f"{len(pending)} of the tasks never finished"
