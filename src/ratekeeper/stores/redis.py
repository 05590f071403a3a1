"""``RedisStore``: the Redis / Valkey store for ``Limiter`` (threads), over ``redis_core``.

One decision is one EVALSHA of the composed script (``redis_script``), decided inside
Redis on Redis's clock. Calls from several threads coalesce: while ``max_in_flight``
calls are out, further callers queue, and the first of them sends everything queued as
one call when a call returns (so a hot key costs a fraction of a round trip per decision).
A lone caller sends at once and pays nothing for this.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ratekeeper.stores import wire
from ratekeeper.stores.redis_calls import RedisCalls
from ratekeeper.stores.redis_core import Batch

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision

__all__ = ["RedisStore"]


class _Waiter:
    """A thread waiting for its op: woken with a result, an error, or the lead of a call."""

    __slots__ = ("error", "event", "lead", "result")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.result: Decision | None = None
        self.error: BaseException | None = None
        self.lead: tuple[list[wire.Op], int | None, list[_Waiter]] | None = None


class RedisStore(RedisCalls):
    """The Redis store (``redis://``, ``rediss://``, ``valkey://``, ``unix://``,
    ``redis+sentinel://``, ``redis+cluster://``); see ``redis_url`` for the options."""

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", **options: Any) -> None:
        super().__init__(url, **options)
        self._lock = threading.Lock()
        self._batch: Batch[_Waiter] = Batch(self.core.max_in_flight, self.core.max_batch)

    def _submit(self, op: wire.Op, now: int | None) -> Decision | None:
        if not self.core.batching:
            return self._run([op], now)[0]
        batch = self._batch
        with self._lock:
            if batch.can_send() and not batch.queue:
                batch.in_flight += 1
                me = None
            else:
                me = _Waiter()
                batch.queue.append((op, now, me))
        if me is None:
            try:
                return self._run([op], now)[0]
            finally:
                self._finish()
        me.event.wait()
        if me.lead is not None:
            ops, at, waiters = me.lead
            try:
                results = self._run(ops, at)
            except BaseException as exc:  # noqa: BLE001 - every waiter of the call gets the error
                for w in waiters:
                    w.error = exc
                results = []
            else:
                for w, result in zip(waiters, results, strict=True):
                    w.result = result
            finally:
                self._finish()
            for w in waiters:
                if w is not me:
                    w.event.set()
        if me.error is not None:
            raise me.error
        return me.result

    def _finish(self) -> None:
        """A call returned: hand the queued ops to the first queued thread, or free the slot."""
        with self._lock:
            batch = self._batch
            if batch.queue:
                ops, now, waiters = batch.take()
                waiters[0].lead = (ops, now, waiters)
                waiters[0].event.set()
            else:
                batch.in_flight -= 1

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

    def close(self) -> None:
        self.client.close()
