"""What the asyncio Redis store does its own way (``driver_threads.py`` is the blocking
store's): calls wait their turn as futures (``AsyncCoalescer``), a coalesced call takes
at most its share of the ops queued and in flight, and a store belongs to the event loop
it is first used on (redis-py's asyncio connections cannot move between loops).
``store_async.py`` imports these names; its generated twin imports the same names from
``driver_threads.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.stores.coalescing import Coalescer
from ratekeeper.stores.coalescing_asyncio import AsyncCoalescer
from ratekeeper.stores.redis.errors import applied_nothing, store_down
from ratekeeper.stores.redis.planner import row

if TYPE_CHECKING:
    from typing import TypeAlias

    from ratekeeper.decision import Decision
    from ratekeeper.stores import wire
    from ratekeeper.stores.redis.planner import RedisPlanner

    Submit: TypeAlias = Callable[[wire.Op, int | None], Awaitable[Decision | bool]]
    """One op's decision (for a refund: whether it gave anything back)."""

__all__ = ["coalescer", "started"]


def coalescer(
    run: Callable[[Sequence[wire.Op], int | None], Awaitable[Sequence[Decision | bool]]], planner: RedisPlanner
) -> AsyncCoalescer[wire.Op, Decision | bool]:
    """How concurrent calls wait their turn (``stores/coalescing.py``): at most
    ``max_in_flight`` calls, each taking its share of the ops queued (``spread``)."""
    return AsyncCoalescer(
        Coalescer(planner.max_in_flight, planner.max_batch, row, spread=True),
        run,
        store_down,
        planner.timeout,
        "Redis",
        "this AsyncRedisStore (AsyncLimiter) was first used on another event loop; redis-py's "
        "connections belong to one loop: open one store per event loop (e.g. inside asyncio.run)",
        applied_nothing,
    )


def started(store: Any) -> None:
    """Nothing to start: the client connects on first use, inside the running loop."""
