"""``ServiceStore``: the ratekeeper service as a store for ``Limiter`` (threads).

Calls from several threads coalesce (``ThreadCoalescer``, ``stores/coalescing.py``):
while ``max_in_flight`` calls are out, further callers queue, and the first of them sends
everything queued as one ``POST /v1/store`` when a call returns. A lone caller sends at
once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ratekeeper.stores.bounds import check_op
from ratekeeper.stores.coalescing import Coalescer
from ratekeeper.stores.coalescing_threads import ThreadCoalescer
from ratekeeper.stores.service.calls import ServiceCalls
from ratekeeper.stores.service.sansio import store_down

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.errors import StoreError
    from ratekeeper.op import Op

__all__ = ["ServiceStore"]


class ServiceStore(ServiceCalls):
    """``http://host:8080`` (or ``https://``) for ``Limiter``; options in
    ``ServiceOptions``. The coalescing guarantees of ``stores/coalescing.py`` hold."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        opts = self.options
        self._coalescer: ThreadCoalescer[Op, Decision | StoreError | bool | None] = ThreadCoalescer(
            Coalescer(opts.max_in_flight, opts.max_batch), self._run, store_down, opts.timeout, "the ratekeeper service"
        )

    def _submit(self, op: Op, now: int | None) -> Decision | bool | None:
        check_op(op, now)  # refused here, as on every store: never sent to the service
        if self.options.batching:
            return self._coalescer.submit(op, now)  # type: ignore[return-value]
        return self._run([op], now)[0]  # type: ignore[return-value]

    def decide(self, op: Op, now: int | None = None) -> Decision:
        decision = self._submit(op, now)
        assert decision is not None and not isinstance(decision, bool)
        return decision

    def refund(self, op: Op, now: int | None = None) -> bool:
        return self._submit(op, now) is True

    def close(self) -> None:
        self.client.close()
