"""``AsyncRedisStore``: the Redis / Valkey store for ``AsyncLimiter``, over ``redis_core``.

Calls made in the same event-loop tick, and calls made while ``max_in_flight`` calls are
out, are sent together: one script call on a single node (ops on one key coalesce into
one read and one write of it), one pipeline of per-slot calls on a Cluster. Each caller
gets its own decision, exactly as if the calls ran one after another.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ratekeeper.stores import wire
from ratekeeper.stores.redis_calls_async import AsyncRedisCalls
from ratekeeper.stores.redis_core import Batch

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision

__all__ = ["AsyncRedisStore"]


class AsyncRedisStore(AsyncRedisCalls):
    """The asyncio twin of ``RedisStore``: the same URLs, options and decisions."""

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", **options: Any) -> None:
        super().__init__(url, **options)
        self._batch: Batch[asyncio.Future[Decision | None]] = Batch(self.core.max_in_flight, self.core.max_batch)
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def _submit(self, op: wire.Op, now: int | None) -> Decision | None:
        if not self.core.batching:
            return (await self._run([op], now))[0]
        future: asyncio.Future[Decision | None] = asyncio.get_running_loop().create_future()
        self._batch.queue.append((op, now, future))
        if not self._scheduled and self._batch.can_send():
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        """Send what is queued, as far as ``max_in_flight`` allows."""
        self._scheduled = False
        batch = self._batch
        while batch.queue and batch.can_send():
            ops, now, futures = batch.take()
            batch.in_flight += 1
            task = asyncio.ensure_future(self._call(ops, now, futures))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, ops: list[wire.Op], now: int | None, futures: list[asyncio.Future[Decision | None]]) -> None:
        try:
            results = await self._run(ops, now)
        except BaseException as exc:
            for f in futures:
                if not f.done():
                    f.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for f, result in zip(futures, results, strict=True):
                if not f.done():
                    f.set_result(result)
        finally:
            self._batch.in_flight -= 1
            if self._batch.queue and not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)

    # -- the AsyncStore role -----------------------------------------------------------

    async def decide(
        self,
        plan: Plan,
        key: str,
        cost: int,
        max_wait: int | None = None,
        lease_id: str | None = None,
        now: int | None = None,
        commit: bool = True,
    ) -> Decision:
        decision = await self._submit((wire.DECIDE if commit else wire.PEEK, plan, key, cost, max_wait, lease_id), now)
        assert decision is not None
        return decision

    async def refund(
        self, plan: Plan, key: str, cost: int, lease_id: str | None = None, now: int | None = None
    ) -> None:
        await self._submit((wire.REFUND, plan, key, cost, None, lease_id), now)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        await self.client.aclose()
