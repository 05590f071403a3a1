"""What the blocking Redis store does its own way (``driver_asyncio.py`` is the asyncio
store's): calls wait their turn as threads (``ThreadCoalescer``), any thread may call,
and a forked child starts afresh. ``store.py`` (generated) imports these names.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.stores.coalescing import Coalescer
from ratekeeper.stores.coalescing_threads import ThreadCoalescer
from ratekeeper.stores.redis.errors import applied_nothing, store_down
from ratekeeper.stores.redis.planner import row

if TYPE_CHECKING:
    from typing import TypeAlias

    from ratekeeper.decision import Decision
    from ratekeeper.stores import wire
    from ratekeeper.stores.redis.planner import RedisPlanner

    Submit: TypeAlias = Callable[[wire.Op, int | None], Decision | bool]
    """One op's decision (for a refund: whether it gave anything back)."""

__all__ = ["coalescer", "started"]


def coalescer(
    run: Callable[[Sequence[wire.Op], int | None], Sequence[Decision | bool]], planner: RedisPlanner
) -> ThreadCoalescer[wire.Op, Decision | bool]:
    """How concurrent calls wait their turn (``stores/coalescing.py``): at most
    ``max_in_flight`` calls; the first thread queued sends everything queued when a call
    returns."""
    return ThreadCoalescer(
        Coalescer(planner.max_in_flight, planner.max_batch, row),
        run,
        store_down,
        planner.timeout,
        "Redis",
        applied_nothing,
    )


def started(store: Any) -> None:
    """Start ``store`` afresh in the child of a fork."""
    _stores.add(store)


_stores: weakref.WeakSet[Any] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child, every store forgets its parent's lanes (their sockets are the
    parent's: forgotten, not closed; redis-py's pools start afresh on their own after a
    fork) and its queue (the parent's threads, and a lock one of them may have held). A
    hook, not a pid check per call: ``os.getpid`` is a system call."""
    for store in list(_stores):
        store.shell.lanes = []
        store._open()


os.register_at_fork(after_in_child=_after_fork)
