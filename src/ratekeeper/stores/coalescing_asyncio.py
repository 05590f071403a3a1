"""``AsyncCoalescer``: the asyncio driver of ``Coalescer`` (see ``coalescing.py`` for the
rules and the guarantees).

Every op is queued with a future; the first op of a tick schedules a flush (``call_soon``)
when a slot is free, so the ops of one tick go together; the flush starts one task per
call, as many as the slots and rows allow, and a call that returns schedules the next
flush. Every caller has a deadline, the store's timeout after its call: one timer per
store, at the oldest deadline still pending (a timer per caller would cost more than the
rest of its queueing), fails the callers whose deadline passed with ``StoreTimeout``; an
op whose caller failed so is dropped from the queue, or its answer is when it was sent.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Generic, TypeVar

from ratekeeper.stores.coalescing import Coalescer, interrupted, too_late
from ratekeeper.stores.coalescing_driver_async import AsyncDriver

__all__ = ["AsyncCoalescer"]

OpT = TypeVar("OpT")
R = TypeVar("R")


class AsyncCoalescer(AsyncDriver[OpT, "asyncio.Future[Any]"], Generic[OpT, R]):
    """Coalesces the calls of many tasks over ``core``; ``run(ops, now)`` sends one call
    (a bound method is held weakly: its object, the store, owns this driver).

    ``name`` names the store in errors; ``loop_error`` is the message of the
    ``RuntimeError`` a second event loop gets; ``applied_nothing`` says which of the store's
    errors applied none of a call (see ``apart`` in ``coalescing.py``).
    """

    def __init__(
        self,
        core: Coalescer[OpT, asyncio.Future[Any]],
        run: Callable[[Sequence[OpT], int | None], Awaitable[Sequence[R]]],
        store_down: Callable[[BaseException], bool],
        timeout: float,
        name: str,
        loop_error: str,
        applied_nothing: Callable[[BaseException], bool] | None = None,
    ) -> None:
        super().__init__(core, run, store_down, timeout, name, applied_nothing)
        self._loop_error = loop_error
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock: Callable[[], float] = time.monotonic
        self._scheduled = False
        self.tasks: set[asyncio.Task[None]] = set()
        """The calls in flight."""
        self._deadlines: deque[tuple[float, asyncio.Future[Any]]] = deque()
        """Each pending caller's deadline, in the order of its call (so, of its deadline)."""
        self._timer: asyncio.TimerHandle | None = None

    def bind(self) -> asyncio.AbstractEventLoop:
        """The running loop, which must be the one this driver was first used on."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._loop is not None:
                raise RuntimeError(self._loop_error)
            self._loop = loop
            # the loop's clock, without a Python frame when it is asyncio's own (time.monotonic)
            self._clock = time.monotonic if type(loop).time is asyncio.BaseEventLoop.time else loop.time
        return loop

    async def submit(self, op: OpT, now: int | None) -> R:
        """``op``'s result, from the call it goes in."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self.bind()
        future: asyncio.Future[R] = loop.create_future()
        core = self.core
        core.push(op, now, future)
        if not self._scheduled and core.in_flight < core.max_in_flight:
            self._scheduled = True
            loop.call_soon(self._flush)
        self._deadlines.append((self._clock() + self.timeout, future))
        if self._timer is None:
            self._timer = loop.call_at(self._deadlines[0][0], self._expire)
        return await future

    def _flush(self) -> None:
        """Start every call that may go now."""
        self._scheduled = False
        core = self.core
        while (call := core.take()) is not None:
            started, now, futures = call
            ran: list[bool] = []
            task = asyncio.ensure_future(self._call(started, now, futures, ran))
            self.tasks.add(task)
            task.add_done_callback(partial(self._ended, started, futures, ran))

    def _expire(self) -> None:
        """Fail the callers whose deadline passed; wait for the next deadline still pending."""
        self._timer = None
        deadlines, loop = self._deadlines, self._loop
        assert loop is not None
        now = self._clock()
        while deadlines:
            deadline, future = deadlines[0]
            if not future.done():
                if deadline > now:
                    self._timer = loop.call_at(deadline, self._expire)
                    return
                future.set_exception(too_late(self.name, self.timeout))
            deadlines.popleft()

    async def _call(
        self, started: list[OpT], now: int | None, futures: list[asyncio.Future[Any]], ran: list[bool]
    ) -> None:
        """Send one call and answer its callers (``ran`` says it did)."""
        ran.append(True)
        ops: Sequence[OpT] = started
        failure: BaseException | None = None
        try:
            for f in futures:
                if f.done():  # its caller was cancelled or timed out while queued: not sent
                    kept = [(op, g) for op, g in zip(started, futures, strict=True) if not g.done()]
                    ops, futures = [op for op, _ in kept], [g for _, g in kept]
                    break
            if ops:
                results = await self._send(ops, now)
                for f, result in zip(futures, results, strict=True):
                    if not f.done():
                        if isinstance(result, Exception):  # its own failure (a Cluster slot's call, or its op's)
                            f.set_exception(result)
                        else:
                            f.set_result(result)
        except BaseException as exc:
            failure = exc
            shared = exc if isinstance(exc, Exception) else interrupted(exc, self.name)
            for f in futures:
                if not f.done():
                    f.set_exception(shared)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._finish(started, failure)

    def _ended(
        self, started: list[OpT], futures: list[asyncio.Future[Any]], ran: list[bool], task: asyncio.Task[None]
    ) -> None:
        """A call's task is done. One cancelled before it ran sent nothing and never ended
        its call: its callers are told here, and its slot freed."""
        self.tasks.discard(task)
        if not ran:
            failure = asyncio.CancelledError()
            error = interrupted(failure, self.name)
            for f in futures:
                if not f.done():
                    f.set_exception(error)
            self._finish(started, failure)

    def _finish(self, started: list[OpT], failure: BaseException | None) -> None:
        """A call ended (in the step that answered its callers, so no op queued after that
        is taken for one queued behind it): its slot is free; when it found the store down,
        the queued callers get its error at once; else the next flush is scheduled."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][1].done():  # answered (this call's, mostly): forgotten
            deadlines.popleft()
        core = self.core
        core.finish(started)
        if core.queue:
            if failure is not None and self._store_down(failure):
                for f in core.drain():
                    if not f.done():
                        f.set_exception(failure)
            elif not self._scheduled and core.in_flight < core.max_in_flight:
                self._scheduled = True
                assert self._loop is not None
                self._loop.call_soon(self._flush)

    async def drain(self) -> None:
        """Wait until every op queued or in flight is answered (for ``aclose``)."""
        core = self.core
        while self.tasks or core.queue:
            if core.queue and not self._scheduled:
                self._flush()
            if self.tasks:
                await asyncio.wait(list(self.tasks))  # unlike gather, never cancels them
            else:
                await asyncio.sleep(0)  # a flush is scheduled
        self._deadlines.clear()  # every caller is answered
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
