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
- ``applied_nothing(exc)`` (optional): whether a failed call is sure to have applied none
  of its ops (then it may be decided again in parts: ``apart``).
- ``timeout``: the store's timeout, also the longest a queued caller waits.

The pieces:

- ``Coalescer`` (here): the queue and the in-flight accounting, no I/O and no locks (the
  thread driver holds its lock around it; the asyncio driver runs on one loop). The next
  call takes the oldest queued op that may go now (its row idle, under the row rule),
  and after it the queued ops that share its ``now``, at most ``max_batch``, in arrival
  order; an op that must stay (another ``now``, a busy row, a full call) keeps every
  later op of its row back, so the ops of one row always apply in arrival order. With
  ``spread`` (the asyncio Redis store), a call takes at most its share of the ops queued and
  in flight (their number over ``max_in_flight``), so that the calls overlap at even sizes:
  the client reads one call's answers while the server decides the other's, where one call
  of every queued op leaves the client idle while the server works, and the server while
  the client does. (Threads gain nothing from it: a thread's own work holds the GIL.)
- ``AsyncDriver`` / ``Driver`` (``coalescing_driver_async.py`` and its generated twin
  ``coalescing_driver.py``): what both drivers hold, and how one call is sent and, when
  one op failed it, its ops decided again apart.
- ``ThreadCoalescer`` (``coalescing_threads.py``): a lone caller with nothing queued and
  a slot free sends at once and pays nothing more than two lock round trips; the others
  queue, and when a call returns the next call is sent by its first still-waiting caller
  (no thread of its own).
- ``AsyncCoalescer`` (``coalescing_asyncio.py``): calls made in one loop tick, and calls
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
   several ops that failed without applying anything because of one op (the client
   refused to encode it; the store's script or statement failed on its data:
   ``applied_nothing``) is decided again in halves (``apart`` below), so only the guilty
   op's caller gets the error and every other caller its own decision, never decided twice.
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
from collections.abc import Callable, Generator, Hashable, Sequence
from typing import Any, Generic, TypeVar

from ratekeeper.errors import StoreError, StoreTimeout

__all__ = ["Coalescer", "apart", "held_weakly", "interrupted", "needs_apart", "splitter", "too_late"]

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


# Re-splitting (``apart``): a call of several ops that failed because of one op's data must
# not fail the others. A store says which of its errors guarantee that the call applied
# nothing (``applied_nothing``: a Lua error raised before the script's writes, a PostgreSQL
# statement error, which rolls the statement back); an exception that is not a StoreError
# was raised by the client while it built the request, before anything was sent. After
# such a failure the ops are decided again in halves, down to the guilty op alone, which
# gets the error; every other op is decided exactly once, in its arrival order. A failure
# that may have applied something (a lost connection, a timeout) is never retried: the
# ops of that call get it, and once the store is down the ops not yet sent get it too.
# The limiters and the stores' entries refuse bad ops first (``stores.bounds``): this is
# the last line, for what only the store can find wrong (a key holding another rule's
# value, say).

Reply = Any
"""A call's reply as the drivers hand it to ``apart``: its results, or what it raised."""


def apart(
    ops: Sequence[OpT],
    first: Reply,
    may_split: Callable[[BaseException], bool],
    store_down: Callable[[BaseException], bool],
) -> Generator[Sequence[OpT], Reply, list[Any]]:
    """Each op's result or its own error, given ``first``, the reply of the call of all of
    ``ops``: yields the ops of each further call to make (in order) and is sent its reply.
    ``may_split(exc)``: ``exc`` failed a call without applying any of it."""
    out: list[Any] = [None] * len(ops)
    todo: list[list[int]] = []  # the position lists still to decide, the next one last
    stop: BaseException | None = None

    def take(positions: list[int], reply: Reply) -> None:
        nonlocal stop
        if isinstance(reply, BaseException):
            if len(positions) > 1 and may_split(reply):
                half = len(positions) // 2
                todo.extend((positions[half:], positions[:half]))
                return
            for i in positions:
                out[i] = reply
            if not may_split(reply) and store_down(reply):
                stop = reply
            return
        shared: dict[int, list[int]] = {}  # a Cluster slot's call that failed, over several ops
        for i, result in zip(positions, reply, strict=True):
            out[i] = result
            if isinstance(result, BaseException) and may_split(result):
                shared.setdefault(id(result), []).append(i)
        todo.extend(reversed([group for group in shared.values() if len(group) > 1]))

    take(list(range(len(ops))), first)
    while todo:
        positions = todo.pop()
        if stop is not None:
            for i in positions:
                out[i] = stop
            continue
        reply = yield [ops[i] for i in positions]
        take(positions, reply)
    return out


def needs_apart(results: Sequence[Any], may_split: Callable[[BaseException], bool]) -> bool:
    """Whether a call's results hold one error shared by several of its ops that applied
    nothing (a Cluster slot's call): those ops are then decided again apart."""
    seen: set[int] = set()
    for result in results:
        if isinstance(result, BaseException) and may_split(result):
            if id(result) in seen:
                return True
            seen.add(id(result))
    return False


def splitter(applied_nothing: Callable[[BaseException], bool] | None) -> Callable[[BaseException], bool]:
    """``may_split`` of a store: not a ``StoreError`` (the client refused to build the call:
    nothing was sent), or a ``StoreError`` its store says applied nothing."""

    def may_split(exc: BaseException) -> bool:
        if not isinstance(exc, Exception):
            return False
        if not isinstance(exc, StoreError):
            return True
        return applied_nothing is not None and applied_nothing(exc)

    return may_split


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
