"""What the asyncio service store does its own way (``driver_threads.py`` is the blocking
store's): its calls wait their turn as futures (``AsyncCoalescer``), and closing it answers
every op queued or in flight first. ``store_async.py`` imports these names; its generated
twin imports the same names from ``driver_threads.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from ratekeeper.stores.coalescing import Coalescer
from ratekeeper.stores.coalescing_asyncio import AsyncCoalescer
from ratekeeper.stores.service.errors import store_down

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.errors import StoreError
    from ratekeeper.op import Op
    from ratekeeper.stores.service.options import ServiceOptions

__all__ = ["coalescer"]


def coalescer(
    run: Callable[[Sequence[Op], int | None], Awaitable[Sequence[Decision | StoreError | bool | None]]],
    options: ServiceOptions,
) -> AsyncCoalescer[Op, Decision | StoreError | bool | None]:
    """Calls made in the same event-loop tick, and calls made while ``max_in_flight`` calls
    are out, go together as one call (``stores/coalescing.py``)."""
    return AsyncCoalescer(
        Coalescer(options.max_in_flight, options.max_batch),
        run,
        store_down,
        options.timeout,
        "the ratekeeper service",
        "this AsyncServiceStore was first used on another event loop; open one store per event loop",
    )
