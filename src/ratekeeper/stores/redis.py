"""``RedisStore``: the Redis / Valkey store for ``Limiter`` (threads), over ``redis_core``.

One decision is one EVALSHA of the composed script (``redis_script``), decided inside
Redis on Redis's clock. Calls from several threads coalesce: while ``max_in_flight``
calls are out, further callers queue, and the first of them sends everything queued as
one call when a call returns (so a hot key costs a fraction of a round trip per decision).
A lone caller sends at once and pays nothing for this.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import StoreError, StoreTimeout
from ratekeeper.stores import wire
from ratekeeper.stores.redis_calls import RedisCalls
from ratekeeper.stores.redis_core import Batch, store_down, translate

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision

__all__ = ["RedisStore"]


class _Waiter:
    """A thread waiting for its op: woken with a result, an error, or the lead of a call.

    ``gone``: the thread stopped waiting (timed out or interrupted) after its op was taken
    into a call; whoever hands out the lead of that call skips it.
    """

    __slots__ = ("error", "event", "gone", "lead", "result")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.result: Decision | None = None
        self.error: BaseException | None = None
        self.lead: tuple[list[wire.Op], int | None, list[_Waiter]] | None = None
        self.gone = False


class RedisStore(RedisCalls):
    """The Redis store (``redis://``, ``rediss://``, ``valkey://``, ``unix://``,
    ``redis+sentinel://``, ``redis+cluster://``); see ``redis_url`` for the options.

    Guarantees of the coalescing: a queued thread waits at most ``timeout`` for its turn
    (then ``StoreTimeout``, its op withdrawn if it was not sent yet); when a call fails
    because Redis timed out or is unreachable, the threads queued behind it get that error
    at once instead of a call of their own; a thread interrupted while it waits (a
    ``KeyboardInterrupt``) hands its place on, so no other thread waits on it.
    """

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", **options: Any) -> None:
        super().__init__(url, **options)
        self._lock = threading.Lock()
        self._lanes: list[Any] = []  # idle single-connection clients (see _on_lane)
        # lanes hold connections of the pool for good: leave at least one to the calls
        # that do not hold a slot (decide_many, reset, batching off)
        self._laned = not self.core.cluster and self.core.max_connections > self.core.max_in_flight
        self._batch: Batch[_Waiter] = Batch(self.core.max_in_flight, self.core.max_batch)
        _LANED.add(self)

    def _submit(self, op: wire.Op, now: int | None) -> Decision | None:
        if not self.core.batching:
            return self._run([op], now)[0]  # type: ignore[no-any-return]
        batch = self._batch
        with self._lock:
            if batch.can_send() and not batch.queue:
                batch.in_flight += 1
                me = None
            else:
                me = _Waiter()
                batch.queue.append((op, now, me))
        if me is None:  # a lone caller: sends at once
            failure: BaseException | None = None
            try:
                return self._on_lane((op,), now)[0]  # type: ignore[no-any-return]
            except BaseException as exc:
                failure = exc
                raise
            finally:
                self._finish(failure)
        try:
            woken = me.event.wait(self.core.timeout)
        except BaseException:
            self._withdraw(me)
            raise
        if not woken and not self._withdraw(me):
            raise StoreTimeout(f"Redis did not answer in time: waited {self.core.timeout}s for the calls in flight")
        if me.lead is not None:
            ops, at, waiters = me.lead
            me.lead = None
            self._lead(ops, at, waiters)
        if me.error is not None:
            raise me.error
        return me.result

    def _lead(self, ops: list[wire.Op], now: int | None, waiters: list[_Waiter]) -> None:
        """Send one call holding an in-flight slot; give each waiter (this thread's among
        them) its result or the error, then pass the slot on."""
        failure: BaseException | None = None
        try:
            results = self._on_lane(ops, now)
        except BaseException as exc:
            failure = exc
            shared = exc if isinstance(exc, Exception) else _interrupted(exc)
            for w in waiters:
                w.error = shared
            if not isinstance(exc, Exception):  # this thread's own interrupt: raised here
                raise
        else:
            for w, result in zip(waiters, results, strict=True):
                if isinstance(result, StoreError):  # its Cluster slot's call failed
                    w.error = result
                else:
                    w.result = result
        finally:
            self._finish(failure)
            for w in waiters:
                w.event.set()

    def _finish(self, failure: BaseException | None) -> None:
        """A call returned: when Redis timed out or is unreachable, every queued thread gets
        that error; else the queued ops go to the first queued thread, or the slot is freed."""
        with self._lock:
            batch = self._batch
            if failure is not None and batch.queue and store_down(failure):
                for _, _, w in batch.queue:
                    w.error = failure
                    w.event.set()
                batch.queue.clear()
            self._hand_on()

    def _hand_on(self) -> None:
        """Give the held in-flight slot to the next queued call, or free it (lock held)."""
        batch = self._batch
        if batch.queue:
            ops, now, waiters = batch.take()
            self._make_lead(ops, now, waiters)
        else:
            batch.in_flight -= 1

    def _make_lead(self, ops: list[wire.Op], now: int | None, waiters: list[_Waiter]) -> None:
        """The first waiter still waiting sends the call (lock held; the slot is held)."""
        kept = [(op, w) for op, w in zip(ops, waiters, strict=True) if not w.gone]
        if not kept:
            self._hand_on()
            return
        lead = kept[0][1]
        lead.lead = ([op for op, _ in kept], now, [w for _, w in kept])
        lead.event.set()

    def _withdraw(self, me: _Waiter) -> bool:
        """``me`` stops waiting (timed out or interrupted). True when it was answered
        meanwhile (its result, error or lead is there: go on as if woken)."""
        with self._lock:
            if me.lead is not None:
                ops, now, waiters = me.lead  # made the lead meanwhile: the next waiter leads
                me.lead = None
                me.gone = True
                self._make_lead(ops, now, waiters)
                return False
            if me.event.is_set():
                return True
            for i, (_, _, w) in enumerate(self._batch.queue):
                if w is me:
                    del self._batch.queue[i]
                    break
            else:
                me.gone = True  # taken into a call in flight: its answer is dropped
            return False

    # -- the Store role ----------------------------------------------------------------

    def decide(
        self,
        plan: Plan,
        key: str,
        cost: int,
        max_wait: int | None = None,
        lease_id: str | None = None,
        now: int | None = None,
        commit: bool = True,
    ) -> Decision:
        decision = self._submit((wire.DECIDE if commit else wire.PEEK, plan, key, cost, max_wait, lease_id), now)
        assert decision is not None
        return decision

    def refund(self, plan: Plan, key: str, cost: int, lease_id: str | None = None, now: int | None = None) -> None:
        self._submit((wire.REFUND, plan, key, cost, None, lease_id), now)

    def _on_lane(self, ops: Sequence[wire.Op], now: int | None) -> list[Any]:
        """``_run`` for a thread holding an in-flight slot, on a connection of its own.

        Each slot's call goes out on an idle single-connection client (a "lane"; at most
        ``max_in_flight`` of them, made on first use) instead of a pool checkout per call:
        redis-py's pools test every connection they hand out for unread data (a poll per
        call) and take a lock, which cost a lone caller more than the rest of our Python.
        A lane whose call failed was disconnected by redis-py and reconnects on its next
        call (behind Sentinel: to the master the sentinels name then). A forked child
        makes lanes of its own (redis-py's pools reset after a fork; a single-connection
        client does not). Not on a Cluster (a connection per node).
        """
        if not self._laned:
            return self._run(ops, now)
        try:
            lane = self._lanes.pop()  # atomic under the GIL: no lock needed
        except IndexError:
            lane = self._new_lane()
        try:
            return self._run(ops, now, client=lane)
        finally:
            self._lanes.append(lane)

    def _new_lane(self) -> Any:
        import redis

        try:
            return redis.Redis(connection_pool=self.client.connection_pool, single_connection_client=True)
        except self._errors as exc:
            raise translate(exc, "a decision (connecting)") from exc

    def close(self) -> None:
        """Close the client (and, behind Sentinel, the connections to the sentinels)."""
        lanes, self._lanes = self._lanes, []
        for lane in lanes:
            lane.close()
        self.client.close()
        manager = getattr(getattr(self.client, "connection_pool", None), "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            sentinel.close()


_LANED: weakref.WeakSet[RedisStore] = weakref.WeakSet()


def _forget_lanes_after_fork() -> None:
    """In a forked child, every store forgets its parent's lanes (their sockets are the
    parent's: forgotten, not closed). A hook, not a pid check per call: ``os.getpid`` is a
    system call, microseconds on this machine."""
    for store in list(_LANED):
        store._lanes = []


os.register_at_fork(after_in_child=_forget_lanes_after_fork)


def _interrupted(exc: BaseException) -> StoreError:
    """What the other waiters of a call get when the thread sending it was interrupted."""
    error = StoreError(f"the thread sending this call to Redis was interrupted ({exc!r}): its outcome is unknown")
    error.__cause__ = exc
    return error
