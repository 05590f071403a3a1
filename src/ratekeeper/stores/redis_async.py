"""``AsyncRedisStore``: the Redis / Valkey store for ``AsyncLimiter``, over ``redis_core``.

Calls made in the same event-loop tick, and calls made while ``max_in_flight`` calls are
out, are sent together: one script call on a single node (ops on one key coalesce into
one read and one write of it), one pipeline of per-slot calls on a Cluster. Each caller
gets its own decision, exactly as if the calls ran one after another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.stores import wire
from ratekeeper.stores.redis_core import Batch, Call, RedisCore, translate

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.stores.base import Item

__all__ = ["AsyncRedisStore"]


class AsyncRedisStore:
    """The asyncio twin of ``RedisStore``: the same URLs, options and decisions."""

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", **options: Any) -> None:
        self.core = RedisCore(url, **options)
        self.client: Any = self.core.target.async_client(self.core.timeout, self.core.max_connections)
        self._batch: Batch[asyncio.Future[Decision | None]] = Batch(self.core.max_in_flight, self.core.max_batch)
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    # -- executing calls ---------------------------------------------------------------

    async def _eval(self, call: Call) -> Any:
        import redis.exceptions as rexc

        try:
            try:
                return await self.client.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
            except rexc.NoScriptError:
                await self.client.script_load(call.script.source)
                return await self.client.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        except rexc.RedisError as exc:
            raise translate(exc, "a decision") from exc

    async def _send(self, calls: Sequence[Call]) -> list[Any]:
        if len(calls) == 1:
            return [await self._eval(calls[0])]
        import redis.exceptions as rexc

        try:
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        except rexc.RedisError as exc:
            raise translate(exc, "a pipeline of decisions") from exc
        for i, reply in enumerate(replies):
            if isinstance(reply, rexc.NoScriptError):
                replies[i] = await self._eval(calls[i])  # the script did not run: safe to send again
            elif isinstance(reply, Exception):
                raise translate(reply, "a decision") from reply
        return replies

    async def _run(self, ops: Sequence[wire.Op], now: int | None, atomic: bool = False) -> list[Decision | None]:
        calls = self.core.calls(ops, now, atomic)
        return self.core.assemble(len(ops), calls, await self._send(calls))

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

    async def decide_many(self, items: Sequence[Item], now: int | None = None) -> tuple[Decision, ...]:
        ops = self.core.many_ops(items)
        calls = self.core.calls(ops, now, atomic=True)
        decisions = self.core.assemble(len(ops), calls, await self._send(calls))
        if len(calls) > 1 and not all(decisions):
            undo = self.core.rollback(calls, decisions)
            if undo:
                await self._run(undo, now)
        return tuple(d for d in decisions if d is not None)

    async def refund(
        self, plan: Plan, key: str, cost: int, lease_id: str | None = None, now: int | None = None
    ) -> None:
        await self._submit((wire.REFUND, plan, key, cost, None, lease_id), now)

    async def reset(self, plan: Plan, key: str) -> None:
        import redis.exceptions as rexc

        try:
            await self.client.delete(self.core.storage_key(plan, key))
        except rexc.RedisError as exc:
            raise translate(exc, "a reset") from exc

    async def aclose(self) -> None:
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        await self.client.aclose()
