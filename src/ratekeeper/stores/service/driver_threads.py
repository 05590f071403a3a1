"""What the blocking service store does its own way (``driver_asyncio.py`` is the asyncio
store's): its calls wait their turn as threads (``ThreadCoalescer``). ``store.py``
(generated) imports these names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ratekeeper.stores.coalescing import Coalescer
from ratekeeper.stores.coalescing_threads import ThreadCoalescer
from ratekeeper.stores.service.errors import store_down

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.errors import StoreError
    from ratekeeper.op import Op
    from ratekeeper.stores.service.options import ServiceOptions

__all__ = ["coalescer"]


def coalescer(
    run: Callable[[Sequence[Op], int | None], Sequence[Decision | StoreError | bool | None]],
    options: ServiceOptions,
) -> ThreadCoalescer[Op, Decision | StoreError | bool | None]:
    """While ``max_in_flight`` calls are out, further callers queue, and the first of them
    sends everything queued as one call when a call returns (``stores/coalescing.py``)."""
    return ThreadCoalescer(
        Coalescer(options.max_in_flight, options.max_batch), run, store_down, options.timeout, "the ratekeeper service"
    )
