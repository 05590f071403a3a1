"""The ratekeeper service as a store (``http://host:8080``): a fleet without Redis or
PostgreSQL shares one ``ratekeeper serve``.

A request's path: ``store_async`` (``AsyncServiceStore``; ``store`` is its generated
blocking twin, ``ServiceStore``) asks ``planner`` (``ServicePlanner``, no I/O) for the body
of its ops, has ``shell_async`` / ``shell`` post it, and has the planner read the reply.
Around them: ``options`` (the URL, TLS, the bearer secret), ``protocol`` (the wire's
bounds and the service's end of it), ``errors``, and ``driver_asyncio`` /
``driver_threads`` (what asyncio and threads do differently).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratekeeper.stores.service.store import ServiceStore
    from ratekeeper.stores.service.store_async import AsyncServiceStore

__all__ = ["AsyncServiceStore", "ServiceStore"]


def __getattr__(name: str) -> Any:
    # The stores load httpx and their coalescing drivers: imported when asked for.
    if name == "ServiceStore":
        from ratekeeper.stores.service.store import ServiceStore

        return ServiceStore
    if name == "AsyncServiceStore":
        from ratekeeper.stores.service.store_async import AsyncServiceStore

        return AsyncServiceStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
