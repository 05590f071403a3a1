"""``ThreadCoalescer``: the thread driver of ``Coalescer`` (see ``coalescing.py`` for the
rules and the guarantees).

A lone caller (nothing queued, a slot free, its row idle) sends at once: no waiter, no
event, two short lock holds. Every other caller queues with a ``_Waiter`` and sleeps on
its signal (a bare lock, acquired in advance: cheaper than an ``Event``) for at most the
store's timeout. When a call returns, the queued ops that may go now are taken as calls,
and each call is handed to its first caller (its "lead"), which wakes up, sends it, and
wakes the others of the call with their results. No thread of its own, no polling.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ratekeeper.stores.coalescing import Coalescer, interrupted, too_late
from ratekeeper.stores.coalescing_driver import Driver

__all__ = ["ThreadCoalescer"]

OpT = TypeVar("OpT")
R = TypeVar("R")


class _Waiter:
    """A queued thread: woken once, with its result, its error, or the lead of a call.

    ``gone``: the thread stopped waiting (timed out or interrupted) after its op left the
    queue; a lead drops its op if the call was not sent yet, and never wakes it.
    """

    __slots__ = ("error", "gone", "lead", "result", "signal")

    def __init__(self) -> None:
        self.signal = threading.Lock()
        self.signal.acquire()  # released once, by whoever wakes this thread
        self.result: object = None
        self.error: BaseException | None = None
        self.lead: tuple[list[Any], int | None, list[_Waiter]] | None = None
        self.gone = False


class ThreadCoalescer(Driver[OpT, _Waiter], Generic[OpT, R]):
    """Coalesces the calls of many threads over ``core``; ``run(ops, now)`` sends one call
    (a bound method is held weakly: its object, the store, owns this driver).

    ``name`` names the store in errors ("Redis", "PostgreSQL"); ``applied_nothing`` says
    which of its errors applied none of a call (see ``apart`` in ``coalescing.py``).
    """

    def __init__(
        self,
        core: Coalescer[OpT, _Waiter],
        run: Callable[[Sequence[OpT], int | None], Sequence[R]],
        store_down: Callable[[BaseException], bool],
        timeout: float,
        name: str,
        applied_nothing: Callable[[BaseException], bool] | None = None,
    ) -> None:
        super().__init__(core, run, store_down, timeout, name, applied_nothing)
        self._lock = threading.Lock()

    def bind(self) -> None:
        """Any thread may call (the asyncio driver binds to its loop here)."""

    def drain(self) -> None:
        """The threads in flight answer their own callers: nothing is left to answer."""

    def submit(self, op: OpT, now: int | None) -> R:
        """``op``'s result, by a call of its own or with others'."""
        core = self.core
        with self._lock:
            if core.start_alone(op):
                me = None
            else:
                me = _Waiter()
                core.push(op, now, me)
                self._start_ready()
        if me is None:  # the lone caller: sends at once
            ops = (op,)
            failure: BaseException | None = None
            try:
                return self._run(self._owner(), ops, now)[0]  # type: ignore[no-any-return]
            except BaseException as exc:
                failure = exc
                raise
            finally:
                with self._lock:  # _finish, written out: the hot path
                    core.finish(ops)
                    if core.queue:
                        self._hand_on(failure)
        return self._wait(me)

    def _wait(self, me: _Waiter) -> R:
        try:
            woken = me.signal.acquire(True, self.timeout)
        except BaseException:  # interrupted while queued: hands its place on
            self._withdraw(me)
            raise
        if not woken and not self._withdraw(me):
            raise too_late(self.name, self.timeout)
        if me.lead is not None:
            return self._lead(me)
        if me.error is not None:
            raise me.error
        return me.result  # type: ignore[return-value]

    def _lead(self, me: _Waiter) -> R:
        """Send the call ``me`` was handed; give each caller of it its result or the error."""
        call = me.lead
        assert call is not None
        started, now, waiters = call
        failure: BaseException | None = None
        try:
            me.lead = None  # from here the finally below ends the call, whatever happens
            ops: Sequence[OpT] = started
            if any(w.gone for w in waiters):  # withdrawn since the call was taken: not sent
                kept = [(op, w) for op, w in zip(started, waiters, strict=True) if not w.gone]
                ops, waiters = [op for op, _ in kept], [w for _, w in kept]
            results = self._send(ops, now)
            for w, result in zip(waiters, results, strict=True):
                if isinstance(result, Exception):  # that op's own failure (a Cluster slot's call, or its own op's)
                    w.error = result
                else:
                    w.result = result
        except BaseException as exc:
            failure = exc
            shared = exc if isinstance(exc, Exception) else interrupted(exc, self.name)
            for w in waiters:
                if w is not me:
                    w.error = shared
            raise  # an interruption of this thread is raised here alone
        finally:
            self._finish(started, failure)
            for w in waiters:
                if w is not me and not w.gone:  # a gone one may hold a wake it never took
                    w.signal.release()
        if me.error is not None:
            raise me.error
        return me.result  # type: ignore[return-value]

    def _finish(self, ops: Sequence[OpT], failure: BaseException | None) -> None:
        """A call returned: its slot (and rows) are free again; see ``_hand_on``."""
        with self._lock:
            core = self.core
            core.finish(ops)
            if core.queue:
                self._hand_on(failure)

    def _hand_on(self, failure: BaseException | None) -> None:
        """After a call that ended with ``failure`` (None: it succeeded), with ops queued: when
        the store is down, the queued callers get its error at once; else the queued ops
        that may go now are handed on (lock held)."""
        if failure is not None and self._store_down(failure):
            for w in self.core.drain():
                w.error = failure
                w.signal.release()
        else:
            self._start_ready()

    def _start_ready(self) -> None:
        """Take every call that may go now and wake its lead (lock held)."""
        core = self.core
        while (call := core.take()) is not None:
            lead = call[2][0]
            lead.lead = call
            lead.signal.release()

    def _pass_lead(self, call: tuple[list[OpT], int | None, list[_Waiter]]) -> None:
        """The lead of ``call`` left before sending it: the next caller of it still waiting
        sends it; if none is left, the call ends unsent (lock held)."""
        for w in call[2]:
            if not w.gone:
                w.lead = call
                w.signal.release()
                return
        self.core.finish(call[0])
        self._start_ready()

    def _withdraw(self, me: _Waiter) -> bool:
        """``me`` stops waiting (timed out or interrupted). True when it was answered
        meanwhile: go on as if woken."""
        with self._lock:
            if me.lead is not None:  # handed a call meanwhile: the next caller of it sends it
                call, me.lead = me.lead, None
                me.gone = True
                self._pass_lead(call)
                return False
            if me.signal.acquire(False):  # woken with its result or error meanwhile
                return True
            if not self.core.withdraw(me):
                me.gone = True  # taken into a call: its op is dropped if not sent, else its answer
            return False
