"""``RedisStore``: the Redis / Valkey store for ``Limiter`` (threads), over ``redis_core``.

One decision is one ``FCALL`` of the store's Functions library (``EVALSHA`` of the same Lua
where the server has no Functions; ``script``), decided inside Redis on Redis's clock.
Calls from several threads coalesce (``ThreadCoalescer``, ``stores/coalescing.py``): while
``max_in_flight`` calls are out, further callers queue, and the first of them sends
everything queued as one call when a call returns (so a hot key costs a fraction of a round
trip per decision). A lone caller sends at once and pays nothing for this.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ratekeeper.stores import wire
from ratekeeper.stores.bounds import check_op
from ratekeeper.stores.coalescing import Coalescer
from ratekeeper.stores.coalescing_threads import ThreadCoalescer
from ratekeeper.stores.redis.calls import RedisCalls
from ratekeeper.stores.redis.sansio import applied_nothing, row, store_down, translate

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op

__all__ = ["RedisStore"]


class RedisStore(RedisCalls):
    """The Redis store (``redis://``, ``rediss://``, ``valkey://``, ``unix://``,
    ``redis+sentinel://``, ``redis+cluster://``); see ``redis_url`` for the options.

    Concurrent calls coalesce with the guarantees of ``stores/coalescing.py`` (a queued
    thread waits at most ``timeout``; errors reach only the calls they concern, and the
    threads queued behind a call that found Redis down or timed out get its error at once;
    an interrupt is its own thread's).
    """

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", **options: Any) -> None:
        super().__init__(url, **options)
        self._coalesce()
        _LANED.add(self)

    _submit: Callable[[wire.Op, int | None], Decision | bool]
    """One op's decision (None for a refund): the coalescer's ``submit``, bound once (one
    call less on the hot path), or ``_alone`` with batching off."""

    def _coalesce(self) -> None:
        """A new queue for this process's calls; each call goes out through ``_on_lane``."""
        core = self.core
        self._coalescer: ThreadCoalescer[wire.Op, Decision | bool] = ThreadCoalescer(
            Coalescer(core.max_in_flight, core.max_batch, row),
            self._on_lane,
            store_down,
            core.timeout,
            "Redis",
            applied_nothing,
        )
        self._submit = self._coalescer.submit if core.batching else self._alone

    def _alone(self, op: wire.Op, now: int | None) -> Decision | bool:
        return self._run([op], now)[0]  # type: ignore[no-any-return]

    # -- the Store role ----------------------------------------------------------------

    def decide(self, op: Op, now: int | None = None) -> Decision:
        check_op(op, now)
        decision = self._submit(op, now)
        assert not isinstance(decision, bool)
        return decision

    def refund(self, op: Op, now: int | None = None) -> bool:
        check_op(op, now)
        return self._submit(op, now) is True

    def _new_lane(self) -> Any:
        """A single-connection client on the pool (a thread's lane, see ``_on_lane``): a
        forked child makes lanes of its own (redis-py's pools reset after a fork; a
        single-connection client does not)."""
        import redis

        try:
            return redis.Redis(connection_pool=self.client.connection_pool, single_connection_client=True)
        except self._errors as exc:
            raise translate(exc, "a decision") from exc  # "Redis is unreachable for a decision: ... connecting ..."

    def close(self) -> None:
        """Close the client (and, behind Sentinel, the connections to the sentinels)."""
        lanes, self._lanes = self._lanes, []
        for lane in lanes:
            lane.close()
        self.client.close()
        manager = getattr(getattr(self.client, "connection_pool", None), "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            sentinel.close()


_LANED: weakref.WeakSet[RedisStore] = weakref.WeakSet()


def _forget_lanes_after_fork() -> None:
    """In a forked child, every store forgets its parent's lanes (their sockets are the
    parent's: forgotten, not closed) and its queue (the parent's threads, and a lock one of
    them may have held). A hook, not a pid check per call: ``os.getpid`` is a system call,
    microseconds on this machine."""
    for store in list(_LANED):
        store._lanes = []
        store._coalesce()


os.register_at_fork(after_in_child=_forget_lanes_after_fork)
