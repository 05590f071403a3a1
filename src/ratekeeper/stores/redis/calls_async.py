"""What the asyncio Redis store sends and how: FCALL or EVALSHA, pipelines, loading, errors.

The source of ``redis_calls.py``: ``tools/unasync.py`` writes the blocking twin from it,
and a test fails when the two differ. Edit this one, then run ``python tools/unasync.py``.
Only the waiting for a turn differs between the two stores (futures here, threads
there), so that lives in ``redis_async.py`` / ``redis.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import StoreError
from ratekeeper.stores import wire
from ratekeeper.stores.bounds import check_op
from ratekeeper.stores.redis.sansio import (
    Call,
    RedisCore,
    function_missing,
    no_functions,
    not_run,
    reclaim_connections,
    store_errors,
    translate,
)
from ratekeeper.stores.redis.script import LIBRARY, Script, script_of

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op

__all__ = ["AsyncRedisCalls"]


class AsyncRedisCalls:
    """The calls of a Redis store: a client, and ``redis_core`` to plan and read them."""

    def __init__(self, url: str, **options: Any) -> None:
        self.core = RedisCore(url, **options)
        self.client: Any = self.core.target.async_client(self.core.timeout, self.core.max_connections)
        from redis.exceptions import NoScriptError, ResponseError

        self._errors = store_errors()
        self._noscript = NoScriptError
        self._refused = ResponseError
        self.functions: bool | None = None
        """False once a call found that decisions must go by ``EVALSHA`` of each call's
        script (a server without Functions, or an ACL that forbids them): decided once, then
        remembered. Otherwise they go by ``FCALL`` of ``LIBRARY`` (True once this store
        loaded it; None while it found it loaded)."""
        self._active = 0  # client calls under way (see _done)
        self._leaked = False
        # lanes hold connections of the pool for good: leave at least one to the calls that
        # do not hold a slot (decide_many, reset, batching off, loading the library)
        self._laned = not self.core.cluster and self.core.max_connections > self.core.max_in_flight
        self._lanes: list[Any] = []  # idle lanes (see _on_lane)

    async def _on_lane(self, ops: Sequence[wire.Op], now: int | None) -> list[Any]:
        """``_run`` for a call holding an in-flight slot, on a connection of its own.

        Each slot's call goes out on an idle lane (at most ``max_in_flight`` of them, made on
        first use by the store's ``_new_lane``) instead of a checkout from the client's pool
        per call: redis-py's pools take a lock and test every connection they hand out, and
        its client dispatches each command, which cost a coalesced call more than the rest
        of our Python. A lane whose call failed was disconnected by redis-py, which retried
        it or reconnects on the next call (behind Sentinel: to the master the sentinels
        name then). Not on a Cluster (a connection per node).
        """
        if not self._laned:
            return await self._run(ops, now)
        try:
            lane = self._lanes.pop()  # one step under the GIL, and asyncio runs one task at a time: no lock
        except IndexError:
            lane = await self._new_lane()
        try:
            return await self._run(ops, now, client=lane)
        finally:
            self._lanes.append(lane)

    async def _new_lane(self) -> Any:
        """A new lane: something with the client's ``execute_command`` and ``script_load``
        on a connection of the pool held for it (each store makes its own)."""
        raise NotImplementedError

    async def _eval(self, call: Call, client: Any = None) -> Any:
        return await self._evalsha(call.script, call.keys, call.args, client)

    async def _evalsha(self, script: Script, keys: list[str], args: list[Any], client: Any = None) -> Any:
        """One decision call (on ``client``, else the store's client): ``FCALL`` of the
        library, or ``EVALSHA`` of ``script`` where the server has no Functions. A call that
        did not run because the server lacks the library (a restart, a failover, a new
        Cluster node) or the script loads it and is sent again; redis-py's errors translated."""
        c = self.client if client is None else client
        self._active += 1
        try:
            for _ in range(2):  # one recovery may lead to another: EVALSHA from now on, then NOSCRIPT
                try:
                    return await self._command(c, script, keys, args)
                except self._refused as exc:
                    if not await self._recover(exc, c, script, keys):
                        raise
            return await self._command(c, script, keys, args)
        except BaseException as exc:
            self._leaked = True
            if isinstance(exc, self._errors):
                raise translate(exc, "a decision") from exc
            raise
        finally:
            self._done()

    def _command(self, c: Any, script: Script, keys: list[str], args: list[Any]) -> Any:
        """Send one decision call (the caller awaits what the asyncio client returns)."""
        if self.functions is False:
            return c.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        return c.execute_command("FCALL", LIBRARY.function, len(keys), *keys, *args)

    async def _recover(self, exc: BaseException, c: Any, script: Script, keys: list[str]) -> bool:
        """Whether the call refused with ``exc`` may be sent again, once what it lacked is
        there: the script (NOSCRIPT), the library ("Function not found": loaded on the node
        that owns the keys and, on a Cluster, on every other primary it can reach), or
        ``EVALSHA`` instead of ``FCALL`` (the server has no Functions, or may not use them)."""
        if isinstance(exc, self._noscript):
            await c.script_load(script.source)
            return True
        if self.functions is False:
            return False
        if no_functions(exc):
            self.functions = False
            return True
        if not function_missing(exc):
            return False
        try:
            await self._load_library(c, keys[0])
        except self._refused as load_exc:
            if not no_functions(load_exc):
                raise
            self.functions = False
        else:
            self.functions = True
        return True

    async def _load_library(self, c: Any, key: str) -> None:
        """``FUNCTION LOAD REPLACE`` of the library where ``key`` lives. On a Cluster redis-py
        would send it to every primary and fail if one of them is down: it goes to the
        key's node (which must take it), then to the other primaries (a failure there is
        theirs: the next call they get loads it)."""
        command = ("FUNCTION", "LOAD", "REPLACE", LIBRARY.source)
        if not self.core.cluster:
            await c.execute_command(*command)
            return
        owner = c.get_node_from_key(key)
        await c.execute_command(*command, target_nodes=owner)
        for node in c.get_primaries():
            if node.name != owner.name:
                try:
                    await c.execute_command(*command, target_nodes=node)
                except self._errors:  # that node loads it at its own first miss
                    self._leaked = True  # (a failed connect may have lost a connection: see _done)

    def _done(self) -> None:
        """A client call ended. After a failure, once no call is under way, give redis-py's
        asyncio Cluster nodes back the connections it lost: a node whose connect failed (or
        whose call was cancelled) never returned that connection to its free list, so after
        ``max_connections`` such failures the node refused every call for good, even once
        it was back ("Too many connections")."""
        self._active -= 1
        if self._leaked and not self._active:
            self._leaked = False
            reclaim_connections(self.client)

    async def _send(self, calls: Sequence[Call], client: Any = None) -> list[Any]:
        """One reply per call. Several calls (a Cluster's slots) go in one pipeline, and a
        call that failed there has its ``StoreError`` in its place: the others stand."""
        if len(calls) == 1:
            return [await self._eval(calls[0], client)]
        self._active += 1
        try:
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                if self.functions is False:  # the sync ClusterPipeline blocks .evalsha()
                    pipe.execute_command("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
                else:
                    pipe.execute_command("FCALL", LIBRARY.function, len(call.keys), *call.keys, *call.args)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        except BaseException as exc:
            self._leaked = True
            if isinstance(exc, self._errors):
                raise translate(exc, "a pipeline of decisions") from exc
            raise
        finally:
            self._done()
        for i, reply in enumerate(replies):
            if isinstance(reply, self._refused) and not_run(reply):
                try:
                    replies[i] = await self._eval(calls[i])  # the call did not run: safe to send again
                except StoreError as exc:
                    replies[i] = exc
            elif isinstance(reply, BaseException):
                error = translate(reply, "a decision")
                error.__cause__ = reply
                replies[i] = error
        return replies

    async def _run(
        self, ops: Sequence[wire.Op], now: int | None, atomic: bool = False, client: Any = None
    ) -> list[Any]:
        """Each op's decision (None for a refund), or, on a Cluster, the ``StoreError`` of
        its slot's call when only some calls failed (raised when they all did)."""
        if len(ops) == 1:  # the path of every lone decision: no planning, one call
            op = ops[0]
            keys, args = wire.encode_redis_one(op, self.core.prefix, now)
            return wire.decode(ops, await self._evalsha(script_of(op[1].algorithm.name), keys, args, client))
        calls = self.core.calls(ops, now, atomic)
        results = self.core.assemble(len(ops), calls, await self._send(calls, client))
        if len(calls) > 1 and all(isinstance(r, StoreError) for r in results):
            raise results[0]
        return results

    async def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        """All or nothing: one atomic call on one node; on a Cluster one per slot, and the
        slots that charged are refunded when another refused or failed (then its error is
        raised)."""
        for op in ops:
            check_op(op, now)
        calls = self.core.calls(ops, now, atomic=True)
        decisions = self.core.assemble(len(ops), calls, await self._send(calls))
        failed = next((d for d in decisions if isinstance(d, StoreError)), None)
        if len(calls) > 1 and (failed is not None or not all(decisions)):
            undo = self.core.rollback(calls, decisions)
            if undo:
                for result in await self._run(undo, now):
                    if isinstance(result, StoreError):
                        raise StoreError(
                            f"a batch over several Cluster slots was refused or failed, and undoing "
                            f"the slots that charged failed too: {result}"
                        ) from result
        if failed is not None:
            raise failed
        return tuple(decisions)

    async def reset(self, plan: Plan, key: str) -> None:
        try:
            await self.client.delete(self.core.storage_key(plan, key))
        except self._errors as exc:
            raise translate(exc, "a reset") from exc
