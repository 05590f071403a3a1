"""``AsyncServiceStore``: the ratekeeper service as a store for ``AsyncLimiter``.

Calls made in the same event-loop tick, and calls made while ``max_in_flight`` calls are
out, go together as one ``POST /v1/store`` (``AsyncCoalescer``, ``stores/coalescing.py``),
which the service decides in order on its own store: a hot key costs a fraction of a
round trip per decision, with the decisions of serial calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ratekeeper.stores.bounds import check_op
from ratekeeper.stores.coalescing import Coalescer
from ratekeeper.stores.coalescing_asyncio import AsyncCoalescer
from ratekeeper.stores.service.calls_async import AsyncServiceCalls
from ratekeeper.stores.service.sansio import store_down

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.errors import StoreError
    from ratekeeper.op import Op

__all__ = ["AsyncServiceStore"]


class AsyncServiceStore(AsyncServiceCalls):
    """``http://host:8080`` (or ``https://``) for ``AsyncLimiter``; options in
    ``ServiceOptions``. The coalescing guarantees of ``stores/coalescing.py`` hold."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        opts = self.options
        self._coalescer: AsyncCoalescer[Op, Decision | StoreError | bool | None] = AsyncCoalescer(
            Coalescer(opts.max_in_flight, opts.max_batch),
            self._run,
            store_down,
            opts.timeout,
            "the ratekeeper service",
            "this AsyncServiceStore was first used on another event loop; open one store per event loop",
        )

    async def _submit(self, op: Op, now: int | None) -> Decision | bool | None:
        check_op(op, now)  # refused here, as on every store: never sent to the service
        if self.options.batching:
            return await self._coalescer.submit(op, now)  # type: ignore[return-value]
        return (await self._run([op], now))[0]  # type: ignore[return-value]

    async def decide(self, op: Op, now: int | None = None) -> Decision:
        decision = await self._submit(op, now)
        assert decision is not None and not isinstance(decision, bool)
        return decision

    async def refund(self, op: Op, now: int | None = None) -> bool:
        return await self._submit(op, now) is True

    async def aclose(self) -> None:
        """Answer every op queued or in flight, then close the connections."""
        await self._coalescer.drain()
        await self.client.aclose()
