"""``AsyncRedisStore``: the Redis / Valkey store for ``AsyncLimiter``, over ``redis_core``.

Calls made in the same event-loop tick, and calls made while ``max_in_flight`` calls are
out, are sent together (``AsyncCoalescer``, ``stores/coalescing.py``): one script call on
a single node (ops on one key coalesce into one read and one write of it), one pipeline of
per-slot calls on a Cluster. Each caller gets its own decision, exactly as if the calls
ran one after another.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ratekeeper.stores import wire
from ratekeeper.stores.bounds import check_op
from ratekeeper.stores.coalescing import Coalescer
from ratekeeper.stores.coalescing_asyncio import AsyncCoalescer
from ratekeeper.stores.redis.calls_async import AsyncRedisCalls
from ratekeeper.stores.redis.lane_async import AsyncLane
from ratekeeper.stores.redis.sansio import applied_nothing, reclaim_connections, row, store_down, translate

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op

__all__ = ["AsyncRedisStore"]


class AsyncRedisStore(AsyncRedisCalls):
    """The asyncio twin of ``RedisStore``: the same URLs, options and decisions.

    Concurrent calls coalesce with the guarantees of ``stores/coalescing.py``: a caller
    queued behind the calls in flight waits at most ``timeout``; a caller cancelled before
    its op is sent withdraws it (nothing is charged), after, leaves the call to finish for
    the others; an error reaches only the calls it concerns (the cancellation of a call
    becomes ``StoreError``, never a ``CancelledError`` in a caller that was not
    cancelled), and when Redis timed out or is unreachable, the ops queued behind the
    failed call get that error at once. ``aclose`` answers every queued op before it
    closes the client. A store belongs to the event loop it is first used on: another
    loop gets a ``RuntimeError`` saying so (redis-py's connections cannot move between
    loops), never a hang.
    """

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", **options: Any) -> None:
        super().__init__(url, **options)
        core = self.core
        self._coalescer: AsyncCoalescer[wire.Op, Decision | bool] = AsyncCoalescer(
            Coalescer(core.max_in_flight, core.max_batch, row, spread=True),
            self._on_lane,
            store_down,
            core.timeout,
            "Redis",
            "this AsyncRedisStore (AsyncLimiter) was first used on another event loop; redis-py's "
            "connections belong to one loop: open one store per event loop (e.g. inside asyncio.run)",
            applied_nothing,
        )
        self._submit = self._coalescer.submit if core.batching else self._alone

    _submit: Callable[[wire.Op, int | None], Awaitable[Decision | bool]]
    """One op's decision (None for a refund): the coalescer's ``submit``, bound once (one
    coroutine less on the hot path), or ``_alone`` with batching off."""

    async def _new_lane(self) -> AsyncLane:
        """A connection of the pool, held (``AsyncLane``: redis-py's own ``Connection`` and
        its retry, without the client's pool checkout and dispatch per call)."""
        try:
            return AsyncLane(await self.client.connection_pool.get_connection())
        except self._errors as exc:
            raise translate(exc, "a decision") from exc

    async def _alone(self, op: wire.Op, now: int | None) -> Decision | bool:
        self._coalescer.bind()  # redis-py's connections belong to one loop, batching or not
        return (await self._run([op], now))[0]  # type: ignore[no-any-return]

    # -- the AsyncStore role -----------------------------------------------------------

    async def decide(self, op: Op, now: int | None = None) -> Decision:
        check_op(op, now)
        decision = await self._submit(op, now)
        assert not isinstance(decision, bool)
        return decision

    async def refund(self, op: Op, now: int | None = None) -> bool:
        check_op(op, now)
        return await self._submit(op, now) is True

    async def aclose(self) -> None:
        """Answer every op queued or in flight, then close the client (and, behind
        Sentinel, the connections to the sentinels)."""
        await self._coalescer.drain()
        lanes, self._lanes = self._lanes, []
        for lane in lanes:
            await self.client.connection_pool.release(lane.connection)
        reclaim_connections(self.client)  # a Cluster node closes only the connections it lists
        await self.client.aclose()
        manager = getattr(getattr(self.client, "connection_pool", None), "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):  # the connections that found the master
            await sentinel.aclose()
