"""``AsyncRedisShell``: sends what a ``RedisPlanner`` planned and hands the replies back.

It holds the redis-py client (``clients.py``) and the lanes (``lane_async.py``), sends a
call on a lane, on the client, or several in one pipeline, loads what a call lacked (the
script after NOSCRIPT, the library after "Function not found", ``EVALSHA`` from then on
where the server has no Functions) and sends it again, and translates redis-py's errors
(``errors.py``). It decides nothing: the planner says what to send and reads the replies.

The source of ``shell.py`` (``RedisShell``): ``tools/unasync.py`` writes it. Edit this one,
then run ``python tools/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import StoreError
from ratekeeper.stores.redis.clients import async_client
from ratekeeper.stores.redis.errors import function_missing, no_functions, not_run, store_errors, translate
from ratekeeper.stores.redis.lane_async import AsyncLane
from ratekeeper.stores.redis.workarounds import ClusterLostConnections, SentinelsLeftOpen

if TYPE_CHECKING:
    from ratekeeper.stores.redis.planner import Call, RedisPlanner

__all__ = ["AsyncRedisShell"]


class AsyncRedisShell:
    """The client of one Redis store, and how its calls go out."""

    def __init__(self, planner: RedisPlanner) -> None:
        from redis.exceptions import NoScriptError, ResponseError

        self.planner = planner
        self.client: Any = async_client(planner.target, planner.timeout, planner.max_connections)
        self._errors = store_errors()
        self._noscript = NoScriptError
        self._refused = ResponseError
        self._active = 0  # client calls under way (see _done)
        self._leaked = False
        self._deciding = _Underway(self, "a decision")
        self._pipelining = _Underway(self, "a pipeline of decisions")
        # lanes hold connections of the pool for good: leave at least one to the calls that
        # do not hold a slot (decide_many, reset, batching off, loading the library)
        self._laned = not planner.cluster and planner.max_connections > planner.max_in_flight
        self.lanes: list[AsyncLane] = []
        """The idle lanes (at most ``max_in_flight``, made on first use)."""

    async def send_on_lane(self, calls: Sequence[Call]) -> list[Any]:
        """``send`` for a call holding an in-flight slot, on a connection of its own.

        Each slot's call goes out on an idle lane instead of a checkout from the client's
        pool per call: redis-py's pools take a lock and test every connection they hand
        out, and its client dispatches each command, which cost a coalesced call more than
        the rest of our Python. A lane whose call failed was disconnected by redis-py,
        which retried it or reconnects on the next call (behind Sentinel: to the master the
        sentinels name then). Not on a Cluster (a connection per node).
        """
        if not self._laned:
            return await self.send(calls)
        try:
            lane = self.lanes.pop()  # one step, and no other thread or task runs in between: no lock
        except IndexError:
            lane = await self._new_lane()
        try:
            return await self.send(calls, lane)
        finally:
            self.lanes.append(lane)

    async def _new_lane(self) -> AsyncLane:
        """A connection of the pool, held."""
        try:
            return AsyncLane(await self.client.connection_pool.get_connection())
        except self._errors as exc:
            raise translate(exc, "a decision") from exc

    async def send(self, calls: Sequence[Call], client: Any = None) -> list[Any]:
        """One reply per call (on ``client``, else the store's client). Several calls (a
        Cluster's slots) go in one pipeline, and a call that failed there has its
        ``StoreError`` in its place: the others stand."""
        if len(calls) == 1:
            return [await self.call(calls[0], client)]
        command = self.planner.command
        with self._pipelining:
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                pipe.execute_command(*command(call))
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        for i, reply in enumerate(replies):
            if isinstance(reply, self._refused) and not_run(reply):
                try:
                    replies[i] = await self.call(calls[i])  # the call did not run: safe to send again
                except StoreError as exc:
                    replies[i] = exc
            elif isinstance(reply, BaseException):
                error = translate(reply, "a decision")
                error.__cause__ = reply
                replies[i] = error
        return replies

    async def call(self, call: Call, client: Any = None) -> Any:
        """One decision call's reply (on ``client``, else the store's client). A call that
        did not run because the server lacks the library (a restart, a failover, a new
        Cluster node) or the script loads it and is sent again; redis-py's errors translated."""
        c = self.client if client is None else client
        command = self.planner.command
        with self._deciding:
            for _ in range(2):  # one recovery may lead to another: EVALSHA from now on, then NOSCRIPT
                try:
                    return await c.execute_command(*command(call))
                except self._refused as exc:
                    if not await self._recover(exc, c, call):
                        raise
            return await c.execute_command(*command(call))

    async def _recover(self, exc: BaseException, c: Any, call: Call) -> bool:
        """Whether the call refused with ``exc`` may be sent again, once what it lacked is
        there: the script (NOSCRIPT), the library ("Function not found": loaded on the node
        that owns the keys and, on a Cluster, on every other primary it can reach), or
        ``EVALSHA`` instead of ``FCALL`` (the server has no Functions, or may not use them)."""
        planner = self.planner
        if isinstance(exc, self._noscript):
            await c.script_load(call.script.source)
            return True
        if planner.functions is False:
            return False
        if no_functions(exc):
            planner.functions = False
            return True
        if not function_missing(exc):
            return False
        try:
            await self._load_library(c, call.keys[0])
        except self._refused as load_exc:
            if not no_functions(load_exc):
                raise
            planner.functions = False
        else:
            planner.functions = True
        return True

    async def _load_library(self, c: Any, key: str) -> None:
        """Load the library where ``key`` lives. On a Cluster redis-py would send it to
        every primary and fail if one of them is down: it goes to the key's node (which
        must take it), then to the other primaries (a failure there is theirs: the next
        call they get loads it)."""
        command = self.planner.library_load()
        if not self.planner.cluster:
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
        """A client call ended. After a failure, once no call is under way, the Cluster
        nodes get back the connections redis-py lost (``ClusterLostConnections``)."""
        self._active -= 1
        if self._leaked and not self._active:
            self._leaked = False
            ClusterLostConnections.reclaim(self.client)

    async def delete(self, key: str) -> None:
        """Delete ``key`` (a reset)."""
        try:
            await self.client.delete(key)
        except self._errors as exc:
            raise translate(exc, "a reset") from exc

    async def aclose(self) -> None:
        """Give the lanes back and close the client (and, behind Sentinel, the connections
        to the sentinels)."""
        lanes, self.lanes = self.lanes, []
        for lane in lanes:
            await self.client.connection_pool.release(lane.connection)
        ClusterLostConnections.reclaim(self.client)  # a Cluster node closes only the connections it lists
        await self.client.aclose()
        await SentinelsLeftOpen.aclose(self.client)


class _Underway:
    """``with``: a client call of ``shell`` under way. A failure marks connections as maybe
    lost (see ``_done``), and redis-py's errors become ours, for ``what``."""

    __slots__ = ("shell", "what")

    def __init__(self, shell: AsyncRedisShell, what: str) -> None:
        self.shell = shell
        self.what = what

    def __enter__(self) -> None:
        self.shell._active += 1

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        shell = self.shell
        if exc is not None:
            shell._leaked = True
        shell._done()
        if isinstance(exc, shell._errors):
            raise translate(exc, self.what) from exc
