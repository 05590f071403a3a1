"""The Redis / Valkey store (standalone, Sentinel, Cluster): one Lua call per decision.

A request's path: ``store_async`` (``AsyncRedisStore``; ``store`` is its generated blocking
twin, ``RedisStore``) asks ``planner`` (``RedisPlanner``, no I/O) for the calls of its ops,
hands them to ``shell_async`` / ``shell`` (the client, the lanes of ``lane_async`` /
``lane``, pipelines, loading the library or a script a call lacked), and has the planner
read the replies. Around them: ``url`` (the URLs and options), ``script`` and ``lua/`` (the
Lua, one file per algorithm, loaded once as a Functions library and called by ``FCALL``; by
``EVALSHA`` where the server has no Functions), ``clients`` (redis-py's clients for a
URL), ``errors`` (redis-py's exceptions, read), ``workarounds`` (where redis-py's own
behaviour is worked around, one class each), and ``driver_asyncio`` / ``driver_threads``
(what asyncio and threads must do differently).

redis-py is imported only when a store is opened (the ``redis`` extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratekeeper.stores.redis.store import RedisStore
    from ratekeeper.stores.redis.store_async import AsyncRedisStore

__all__ = ["AsyncRedisStore", "RedisStore"]


def __getattr__(name: str) -> Any:
    # The stores load their coalescing drivers: imported when asked for, not with the package.
    if name == "RedisStore":
        from ratekeeper.stores.redis.store import RedisStore

        return RedisStore
    if name == "AsyncRedisStore":
        from ratekeeper.stores.redis.store_async import AsyncRedisStore

        return AsyncRedisStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
