"""What the blocking Redis store sends and how: script calls, pipelines, NOSCRIPT, errors.

Generated from ``redis_calls_async.py`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
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

__all__ = ["RedisCalls"]


class RedisCalls:
    """The calls of a Redis store: a client, and ``redis_core`` to plan and read them."""

    def __init__(self, url: str, **options: Any) -> None:
        self.core = RedisCore(url, **options)
        self.client: Any = self.core.target.sync_client(self.core.timeout, self.core.max_connections)

    def _eval(self, call: Call) -> Any:
        import redis.exceptions as rexc

        try:
            try:
                return self.client.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
            except rexc.NoScriptError:
                self.client.script_load(call.script.source)
                return self.client.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        except rexc.RedisError as exc:
            raise translate(exc, "a decision") from exc

    def _send(self, calls: Sequence[Call]) -> list[Any]:
        if len(calls) == 1:
            return [self._eval(calls[0])]
        import redis.exceptions as rexc

        try:
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
            replies: list[Any] = pipe.execute(raise_on_error=False)
        except rexc.RedisError as exc:
            raise translate(exc, "a pipeline of decisions") from exc
        for i, reply in enumerate(replies):
            if isinstance(reply, rexc.NoScriptError):
                replies[i] = self._eval(calls[i])  # the script did not run: safe to send again
            elif isinstance(reply, Exception):
                raise translate(reply, "a decision") from reply
        return replies

    def _run(self, ops: Sequence[wire.Op], now: int | None, atomic: bool = False) -> list[Decision | None]:
        calls = self.core.calls(ops, now, atomic)
        return self.core.assemble(len(ops), calls, self._send(calls))

    def decide_many(self, items: Sequence[Item], now: int | None = None) -> tuple[Decision, ...]:
        """All or nothing: one atomic call on one node; on a Cluster one per slot, and the
        slots that charged are refunded when another refused."""
        ops = self.core.many_ops(items)
        calls = self.core.calls(ops, now, atomic=True)
        decisions = self.core.assemble(len(ops), calls, self._send(calls))
        if len(calls) > 1 and not all(decisions):
            undo = self.core.rollback(calls, decisions)
            if undo:
                self._run(undo, now)
        return tuple(d for d in decisions if d is not None)

    def reset(self, plan: Plan, key: str) -> None:
        import redis.exceptions as rexc

        try:
            self.client.delete(self.core.storage_key(plan, key))
        except rexc.RedisError as exc:
            raise translate(exc, "a reset") from exc
