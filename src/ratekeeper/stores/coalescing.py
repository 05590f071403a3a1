"""Hot-key coalescing of the server stores, written once: a sans-IO queue and two drivers.

Concurrent calls of one process go to the store together: while ``max_in_flight`` calls
are out, further ops queue, and the queued ops leave as one call (a list of ops, one
result each, applied in order) when a call returns, so a hot key costs a fraction of a
round trip per decision. Each store supplies only how to run one call and what it knows
about its errors and rows:

- ``run(ops, now) -> results``: one call deciding ``ops`` in order, one result each (a
  result that is a ``StoreError`` is that op's failure alone: a Redis Cluster slot whose
  call failed); it raises when the call as a whole failed. A call of one op raises
  rather than returning its error (the lone caller's path does not check its result).
- ``row(op)`` (optional): which row or key an op decides on. With it, ops of other rows
  may go past an op that waits for another ``now``; with ``one_call_per_row`` too, a row
  with a call in flight queues its further ops (PostgreSQL: a second statement on a row
  would only wait for the first one's row lock on the server).
- ``store_down(exc)``: whether a failed call says the store timed out or is unreachable.
- ``timeout``: the store's timeout, also the longest a queued caller waits.

The pieces:

- ``Coalescer`` (here): the queue and the in-flight accounting, no I/O and no locks (the
  thread driver holds its lock around it; the asyncio driver runs on one loop). The next
  call takes the oldest queued op that may go now (its row idle, under the row rule),
  and after it the queued ops that share its ``now``, at most ``max_batch``, in arrival
  order; an op that must stay (another ``now``, a busy row, a full call) keeps every
  later op of its row back, so the ops of one row always apply in arrival order. With
  ``spread`` (the asyncio Redis store), a call takes at most its share of the ops queued and in flight (their
  number over ``max_in_flight``), so that the calls overlap at even sizes: the client reads
  one call's answers while the server decides the other's, where one call of every queued
  op leaves the client idle while the server works, and the server while the client does.
  (Threads gain nothing from it: a thread's own work holds the GIL, and 16 threads on a hot
  key measured 8 % slower with it.)
- ``ThreadCoalescer`` (``coalescing_threads.py``): a lone caller with nothing queued and
  a slot free sends at once and pays nothing more than two lock round trips; the others
  queue, and when a call returns the next call is sent by its first still-waiting caller
  (no thread of its own).
- ``AsyncCoalescer`` (``coalescing_async.py``): calls made in one loop tick, and calls
  made while ``max_in_flight`` calls are out, go together (a ``call_soon`` flush, one task
  per call); ``drain`` answers every queued and in-flight op (the stores' ``aclose``); the
  driver belongs to the event loop it is first used on (another loop: ``RuntimeError``).

The guarantees, the same for every store, sync and asyncio:

1. A queued caller waits at most the store's timeout (counted from its call) for its
   turn, then gets ``StoreTimeout``: its op is withdrawn if it was not sent yet (nothing
   charged); if it went out in another caller's call, its answer is dropped. A caller
   whose op is sent at once (the lone thread) or whose turn came (the thread that sends
   a queued call) waits for that call, which the store bounds by the same timeout: no
   caller waits much more than twice the timeout, whatever the calls ahead of it do.
   (With asyncio every op waits in the queue for its tick's flush, so every caller has
   the deadline.)
2. An error reaches only the calls it concerns: a result that is a ``StoreError`` goes to
   that op's caller alone; a call that failed with a ``StoreError`` fails its own callers;
   when it failed because the store is down or timed out (``store_down``), the callers
   queued behind it get that same error at once instead of a call of their own. A call of
   several ops that raised anything else (the client refused to encode an op: the call
   was never sent; see ``one_by_one`` below) is sent again one op per call, so each caller
   gets its own op's answer or error, never another caller's exception.
3. A caller's interruption is its own: a ``KeyboardInterrupt`` / ``SystemExit`` in the
   thread that sends a call (or the cancellation of the task that runs it) is raised
   there alone; the other callers of that call get a ``StoreError`` saying its outcome is
   unknown (the interruption as its ``__cause__``). A thread interrupted while queued
   withdraws its op and hands on its place (no one waits on it); a task cancelled before
   its op is sent withdraws it (nothing charged), and after, leaves the call to finish
   for the others.
"""

from __future__ import annotations

import inspect
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from ratekeeper.errors import StoreError, StoreTimeout

__all__ = ["Coalescer", "held_weakly", "interrupted", "too_late"]

OpT = TypeVar("OpT")
W = TypeVar("W")

_UNSET: Any = object()


class Coalescer(Generic[OpT, W]):
    """The queued ops of one store and its calls in flight (no I/O, no locking).

    ``queue`` holds ``(op, now, waiter)`` in arrival order; a waiter ``W`` is whatever the
    driver wakes (a thread's waiter, a future). A call goes out through ``start_alone``
    (one op, nothing queued) or ``take`` (the next call's ops), and returns through
    ``finish`` with the ops it started with.
    """

    __slots__ = ("busy", "in_flight", "max_batch", "max_in_flight", "queue", "row", "sent", "spread")

    def __init__(
        self,
        max_in_flight: int,
        max_batch: int,
        row: Callable[[OpT], Hashable] | None = None,
        one_call_per_row: bool = False,
        spread: bool = False,
    ) -> None:
        if one_call_per_row and row is None:
            raise ValueError("one_call_per_row needs the row function")
        self.queue: deque[tuple[OpT, int | None, W]] = deque()
        self.in_flight = 0
        self.sent = 0
        """Ops in the calls in flight."""
        self.max_in_flight = max_in_flight
        self.max_batch = max_batch
        self.row = row
        self.spread = spread
        self.busy: dict[Hashable, int] | None = {} if one_call_per_row else None
        """Under the row rule: each row with a call in flight, and how many of its ops."""

    def start_alone(self, op: OpT) -> bool:
        """Whether ``op`` may go at once, alone (nothing queued, a slot free, its row idle);
        if so its call is started."""
        if self.in_flight >= self.max_in_flight or self.queue:
            return False
        busy = self.busy
        if busy is not None:
            row = self.row(op)  # type: ignore[misc]
            if row in busy:
                return False
            busy[row] = 1
        self.in_flight += 1
        self.sent += 1
        return True

    def push(self, op: OpT, now: int | None, waiter: W) -> None:
        """Queue ``op`` (after ``start_alone`` said no)."""
        self.queue.append((op, now, waiter))

    def can_send(self) -> bool:
        return self.in_flight < self.max_in_flight

    def take(self) -> tuple[list[OpT], int | None, list[W]] | None:
        """The next call's ops, their ``now`` and their waiters, already started; None when
        no slot is free or nothing queued may go now."""
        queue = self.queue
        if self.in_flight >= self.max_in_flight or not queue:
            return None
        busy, row, limit = self.busy, self.row, self.max_batch
        if self.spread:  # this call's share of the ops queued and in flight
            limit = min(limit, -(-(len(queue) + self.sent) // self.max_in_flight))
        blocked: set[Hashable] = set(busy) if busy else set()  # rows none of whose ops may go now
        ops: list[OpT] = []
        waiters: list[W] = []
        kept: list[tuple[OpT, int | None, W]] = []
        now: int | None = _UNSET
        while queue:
            entry = queue.popleft()
            if len(ops) >= limit:
                queue.appendleft(entry)
                break
            if blocked and row(entry[0]) in blocked:  # type: ignore[misc]
                kept.append(entry)
                continue
            if now is _UNSET:
                now = entry[1]
            elif entry[1] != now:
                kept.append(entry)
                if row is None:  # rows unknown: no later op may overtake it
                    break
                blocked.add(row(entry[0]))
                continue
            ops.append(entry[0])
            waiters.append(entry[2])
        if kept:
            queue.extendleft(reversed(kept))
        if not ops:
            return None
        self.in_flight += 1
        self.sent += len(ops)
        if busy is not None:
            for op in ops:
                r = row(op)  # type: ignore[misc]
                busy[r] = busy.get(r, 0) + 1
        return ops, now, waiters

    def finish(self, ops: Sequence[OpT]) -> None:
        """The call started with ``ops`` returned (or failed)."""
        self.in_flight -= 1
        self.sent -= len(ops)
        busy = self.busy
        if busy is not None:
            row = self.row
            for op in ops:
                r = row(op)  # type: ignore[misc]
                left = busy[r] - 1
                if left:
                    busy[r] = left
                else:
                    del busy[r]

    def withdraw(self, waiter: W) -> bool:
        """Take ``waiter``'s op out of the queue; False when it is not there (taken)."""
        for i, entry in enumerate(self.queue):
            if entry[2] is waiter:
                del self.queue[i]
                return True
        return False

    def drain(self) -> list[W]:
        """Empty the queue: the waiters of every queued op, in arrival order."""
        waiters = [entry[2] for entry in self.queue]
        self.queue.clear()
        return waiters


# one_by_one: when a call of several ops raises an exception that is not a StoreError, the
# drivers send each op again in a call of its own and give each caller its own answer. The
# stores translate every error of the store and of the connection to a StoreError; anything
# else is raised by the client while it builds the request (an op it cannot encode), before
# anything was sent, so sending the ops again charges nothing twice. The limiters refuse
# such ops at the call (InvalidRequest): this is the last line, for an op that slipped past.


def held_weakly(run: Callable[..., Any]) -> tuple[Callable[..., Any], Callable[[], Any]]:
    """``run`` as ``(function, owner)``, called ``function(owner(), *args)``, with only a weak
    reference to its object when it is a bound method: a store owns its driver, and a
    driver holding the store's method would make a cycle, which only the garbage collector
    frees (an unclosed store's sockets with it), not the store's last reference. (Cheaper
    than ``weakref.WeakMethod``, which makes a bound method per call.)"""
    if inspect.ismethod(run):
        return run.__func__, weakref.ref(run.__self__)
    return _call_plain, lambda: run


def _call_plain(run: Callable[..., Any], *args: Any) -> Any:
    return run(*args)


def interrupted(exc: BaseException, store: str) -> StoreError:
    """What the other callers of a call get when the thread or task running it was
    interrupted or cancelled (``exc``, chained as the cause)."""
    error = StoreError(
        f"the call to {store} carrying this op was interrupted ({exc!r}) in the thread or task "
        "sending it: its outcome is unknown"
    )
    error.__cause__ = exc
    return error


def too_late(store: str, timeout: float) -> StoreTimeout:
    """What a queued caller gets when its timeout passes before its answer."""
    return StoreTimeout(f"{store} did not answer in time: waited {timeout}s for this op's turn and its call")
