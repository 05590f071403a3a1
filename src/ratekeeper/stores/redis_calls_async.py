"""What the asyncio Redis store sends and how: script calls, pipelines, NOSCRIPT, errors.

The source of ``redis_calls.py``: ``tools/unasync.py`` writes the blocking twin from it,
and a test fails when the two differ. Edit this one, then run ``python tools/unasync.py``.
Only the waiting for a turn differs between the two stores (futures here, threads
there), so that lives in ``redis_async.py`` / ``redis.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.stores import wire
from ratekeeper.stores.redis_core import Call, RedisCore, translate

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.stores.base import Item

__all__ = ["AsyncRedisCalls"]


class AsyncRedisCalls:
    """The calls of a Redis store: a client, and ``redis_core`` to plan and read them."""

    def __init__(self, url: str, **options: Any) -> None:
        self.core = RedisCore(url, **options)
        self.client: Any = self.core.target.async_client(self.core.timeout, self.core.max_connections)

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

    async def decide_many(self, items: Sequence[Item], now: int | None = None) -> tuple[Decision, ...]:
        """All or nothing: one atomic call on one node; on a Cluster one per slot, and the
        slots that charged are refunded when another refused."""
        ops = self.core.many_ops(items)
        calls = self.core.calls(ops, now, atomic=True)
        decisions = self.core.assemble(len(ops), calls, await self._send(calls))
        if len(calls) > 1 and not all(decisions):
            undo = self.core.rollback(calls, decisions)
            if undo:
                await self._run(undo, now)
        return tuple(d for d in decisions if d is not None)

    async def reset(self, plan: Plan, key: str) -> None:
        import redis.exceptions as rexc

        try:
            await self.client.delete(self.core.storage_key(plan, key))
        except rexc.RedisError as exc:
            raise translate(exc, "a reset") from exc
