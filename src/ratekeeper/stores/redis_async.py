"""``AsyncRedisStore``: the Redis / Valkey store for ``AsyncLimiter``, over ``redis_core``.

Calls made in the same event-loop tick, and calls made while ``max_in_flight`` calls are
out, are sent together: one script call on a single node (ops on one key coalesce into
one read and one write of it), one pipeline of per-slot calls on a Cluster. Each caller
gets its own decision, exactly as if the calls ran one after another.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import StoreError
from ratekeeper.stores import wire
from ratekeeper.stores.redis_calls_async import AsyncRedisCalls
from ratekeeper.stores.redis_core import Batch, reclaim_connections, store_down

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision

__all__ = ["AsyncRedisStore"]


class AsyncRedisStore(AsyncRedisCalls):
    """The asyncio twin of ``RedisStore``: the same URLs, options and decisions.

    Guarantees of the batching: a caller cancelled before its op is sent withdraws it
    (nothing is charged); a caller cancelled after leaves the call to finish for the
    others; an error reaches every caller of the call (the cancellation of a call
    becomes ``StoreError``, never a ``CancelledError`` in a caller that was not
    cancelled); when Redis timed out or is unreachable, the ops queued behind the failed
    call get that error at once instead of a call of their own; ``aclose`` answers every
    queued op before it closes the client. A store belongs to the event loop it is first
    used on: another loop gets a ``RuntimeError`` saying so (redis-py's connections
    cannot move between loops), never a hang.
    """

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", **options: Any) -> None:
        super().__init__(url, **options)
        self._batch: Batch[asyncio.Future[Decision | None]] = Batch(self.core.max_in_flight, self.core.max_batch)
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _submit(self, op: wire.Op, now: int | None) -> Decision | None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._bind(loop)
        if not self.core.batching:
            return (await self._run([op], now))[0]  # type: ignore[no-any-return]
        future: asyncio.Future[Decision | None] = loop.create_future()
        batch = self._batch
        batch.queue.append((op, now, future))
        if not self._scheduled and batch.in_flight < batch.max_in_flight:
            self._scheduled = True
            loop.call_soon(self._flush)
        return await future

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not None:
            raise RuntimeError(
                "this AsyncRedisStore (AsyncLimiter) was first used on another event loop; redis-py's "
                "connections belong to one loop: open one store per event loop (e.g. inside asyncio.run)"
            )
        self._loop = loop

    def _flush(self) -> None:
        """Send what is queued, as far as ``max_in_flight`` allows; ops whose caller was
        cancelled meanwhile are not sent."""
        self._scheduled = False
        batch = self._batch
        while batch.queue and batch.can_send():
            ops, now, futures = batch.take()
            if any(f.done() for f in futures):
                kept = [(op, f) for op, f in zip(ops, futures, strict=True) if not f.done()]
                if not kept:
                    continue
                ops, futures = [op for op, _ in kept], [f for _, f in kept]
            batch.in_flight += 1
            task = asyncio.ensure_future(self._call(ops, now, futures))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, ops: list[wire.Op], now: int | None, futures: list[asyncio.Future[Decision | None]]) -> None:
        failure: BaseException | None = None
        try:
            results = await self._run(ops, now)
        except BaseException as exc:
            failure = exc
            shared = exc if isinstance(exc, Exception) else _interrupted(exc)
            for f in futures:
                if not f.done():
                    f.set_exception(shared)
            if not isinstance(exc, Exception):
                raise
        else:
            for f, result in zip(futures, results, strict=True):
                if not f.done():
                    if isinstance(result, StoreError):  # its Cluster slot's call failed
                        f.set_exception(result)
                    else:
                        f.set_result(result)
        finally:
            batch = self._batch
            batch.in_flight -= 1
            if failure is not None and batch.queue and store_down(failure):
                for _, _, f in batch.queue:
                    if not f.done():
                        f.set_exception(failure)
                batch.queue.clear()
            if batch.queue and not self._scheduled:
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
        """Answer every op queued or in flight, then close the client (and, behind
        Sentinel, the connections to the sentinels)."""
        while self._tasks or self._batch.queue:
            if self._batch.queue and not self._scheduled:
                self._flush()
            if self._tasks:
                await asyncio.wait(list(self._tasks))  # unlike gather, never cancels them
            else:
                await asyncio.sleep(0)  # a flush is scheduled
        reclaim_connections(self.client)  # a Cluster node closes only the connections it lists
        await self.client.aclose()
        manager = getattr(getattr(self.client, "connection_pool", None), "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):  # the connections that found the master
            await sentinel.aclose()


def _interrupted(exc: BaseException) -> StoreError:
    """What the callers of a call get when the call itself was cancelled or interrupted."""
    error = StoreError(f"the call to Redis was interrupted ({exc!r}): its outcome is unknown")
    error.__cause__ = exc
    return error
