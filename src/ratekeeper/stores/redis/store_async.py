"""``AsyncRedisStore``: the Redis / Valkey store for ``AsyncLimiter``.

One decision is one ``FCALL`` of the store's Functions library (``EVALSHA`` of the same Lua
where the server has no Functions; ``script.py``), decided inside Redis on Redis's clock.
Concurrent calls coalesce (``stores/coalescing.py``): while ``max_in_flight`` calls are
out, further callers queue, and go together when a call returns: one script call on a
single node (ops on one key coalesce into one read and one write of it), one pipeline of
per-slot calls on a Cluster. Each caller gets its own decision, exactly as if the calls
ran one after another; a lone caller sends at once.

The store holds a planner (``planner.py``: what to send, how to read the replies) and a
shell (``shell_async.py``: sends it). The source of ``store.py``: ``tools/unasync.py``
writes ``RedisStore`` from it; what the two do differently comes from
``driver_asyncio.py`` / ``driver_threads.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import StoreError
from ratekeeper.stores.bounds import check_op
from ratekeeper.stores.redis.driver_asyncio import coalescer, started
from ratekeeper.stores.redis.planner import RedisPlanner
from ratekeeper.stores.redis.shell_async import AsyncRedisShell

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op
    from ratekeeper.stores import wire
    from ratekeeper.stores.redis.driver_asyncio import Submit

__all__ = ["AsyncRedisStore"]


class AsyncRedisStore:
    """The Redis store (``redis://``, ``rediss://``, ``valkey://``, ``unix://``,
    ``redis+sentinel://``, ``redis+cluster://``); see ``stores/redis/url.py`` for the options.

    Concurrent calls coalesce with the guarantees of ``stores/coalescing.py``: a caller
    queued behind the calls in flight waits at most ``timeout``; an error reaches only the
    calls it concerns, and when Redis timed out or is unreachable, the ops queued behind
    the failed call get that error at once. An asyncio store belongs to the event loop it
    is first used on: another loop gets a ``RuntimeError`` saying so, never a hang; a
    caller cancelled before its op is sent withdraws it (nothing is charged), after,
    leaves the call to finish for the others.
    """

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", **options: Any) -> None:
        self.planner = RedisPlanner(url, **options)
        self.shell = AsyncRedisShell(self.planner)
        self._open()
        started(self)

    _submit: Submit
    """One op's decision (for a refund: whether it gave anything back): the queue's
    ``submit``, bound once, or ``_alone`` with batching off."""

    def _open(self) -> None:
        """A new queue for this process's calls; each call goes out on a lane."""
        self._coalescer = coalescer(self._on_lane, self.planner)
        self._submit = self._coalescer.submit if self.planner.batching else self._alone

    async def _on_lane(self, ops: Sequence[wire.Op], now: int | None) -> list[Any]:
        """A coalesced call, holding an in-flight slot: ``ops`` decided on a lane."""
        planner = self.planner
        calls = planner.plan(ops, now)
        return planner.read(calls, await self.shell.send_on_lane(calls))

    async def _run(self, ops: Sequence[wire.Op], now: int | None, atomic: bool = False) -> list[Any]:
        """Each op's decision (for a refund: whether it gave anything back), or, on a
        Cluster, the ``StoreError`` of its slot's call when only some calls failed (raised
        when they all did)."""
        planner = self.planner
        calls = planner.plan(ops, now, atomic)
        return planner.read(calls, await self.shell.send(calls))

    async def _alone(self, op: wire.Op, now: int | None) -> Decision | bool:
        self._coalescer.bind()
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

    async def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        """All or nothing: one atomic call on one node; on a Cluster one per slot, and the
        slots that charged are refunded when another refused or failed (then its error is
        raised)."""
        for op in ops:
            check_op(op, now)
        planner = self.planner
        calls = planner.plan(ops, now, atomic=True)
        decisions = planner.read(calls, await self.shell.send(calls))
        failed = next((d for d in decisions if isinstance(d, StoreError)), None)
        if len(calls) > 1 and (failed is not None or not all(decisions)):
            undo = planner.rollback(calls, decisions)
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
        await self.shell.delete(self.planner.storage_key(plan, key))

    async def aclose(self) -> None:
        """Answer every op queued or in flight, then close the client (and, behind
        Sentinel, the connections to the sentinels)."""
        await self._coalescer.drain()
        await self.shell.aclose()
