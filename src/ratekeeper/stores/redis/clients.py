"""redis-py clients for a ``RedisTarget``: ``sync_client`` (threads) and ``async_client``
(asyncio), with the same timeouts, retries and workarounds (``workarounds.py``).

A timed-out call is never sent again (the script may have run: sending it again could
charge twice, and would triple the time a caller waits); a refused or broken connection
is retried twice (a restarted server, a failover). On a Cluster nothing is retried
(``ClusterRetries``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ratekeeper.stores.redis.workarounds import (
    ClusterFcallKeys,
    ClusterRetries,
    HiredisPacking,
    SentinelNewestMaster,
    SentinelReadDisconnect,
    SentinelReconnectToMaster,
)

if TYPE_CHECKING:
    from ratekeeper.stores.redis.url import RedisTarget

__all__ = ["async_client", "sync_client"]


def _timeouts(timeout: float) -> dict[str, Any]:
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout}


def _common(timeout: float, retry_class: Any, connection_error: Any, read_only_error: Any) -> dict[str, Any]:
    """The options of a standalone or Sentinel client."""
    from redis.backoff import ExponentialBackoff

    return {
        **_timeouts(timeout),
        "retry": retry_class(ExponentialBackoff(cap=0.05, base=0.005), 2, (connection_error,)),
        "retry_on_error": [connection_error, read_only_error],
    }


def _auth(target: RedisTarget) -> dict[str, Any]:
    return {"username": target.username, "password": target.password}


def _master(
    target: RedisTarget, sentinel_class: Any, connection_class: Any, max_connections: int, common: dict[str, Any]
) -> Any:
    """The client of the master that the sentinels of ``target`` name (looked up on connect)."""
    timeouts = {k: common[k] for k in ("socket_timeout", "socket_connect_timeout")}
    sentinel = sentinel_class(list(target.nodes), sentinel_kwargs=timeouts, **timeouts)
    return sentinel.master_for(
        target.service,
        db=target.db,
        ssl=target.ssl,
        max_connections=max_connections,
        connection_class=connection_class,
        **_auth(target),
        **common,
    )


def sync_client(target: RedisTarget, timeout: float, max_connections: int) -> Any:
    """A blocking redis-py client for ``target``."""
    import redis
    from redis.retry import Retry

    if target.kind == "cluster":
        from redis.cluster import ClusterNode, RedisCluster

        client = RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in target.nodes],  # type: ignore[no-untyped-call]
            ssl=target.ssl,
            max_connections=max_connections,
            retry=ClusterRetries.none(Retry),
            **_auth(target),
            **_timeouts(timeout),
        )
        ClusterFcallKeys.install(client, sync=True)
        return client
    common = _common(timeout, Retry, redis.exceptions.ConnectionError, redis.exceptions.ReadOnlyError)
    if target.kind == "standalone":  # a blocking pool: more threads than connections wait their turn
        pool = redis.BlockingConnectionPool.from_url(
            target.url, max_connections=max_connections, timeout=timeout, **common
        )
        return redis.Redis.from_pool(pool)  # closing the client closes the pool
    from redis.sentinel import Sentinel, SentinelManagedConnection, SentinelManagedSSLConnection

    base = SentinelManagedSSLConnection if target.ssl else SentinelManagedConnection
    connection_class = SentinelReadDisconnect.sync(SentinelReconnectToMaster.sync(base))
    return _master(target, SentinelNewestMaster.sync(Sentinel), connection_class, max_connections, common)


def async_client(target: RedisTarget, timeout: float, max_connections: int) -> Any:
    """An asyncio redis-py client for ``target``; every connection packs with hiredis
    (``HiredisPacking``)."""
    import redis.asyncio as aredis
    from redis.asyncio.retry import Retry

    if target.kind == "cluster":
        from redis.asyncio.cluster import ClusterNode, RedisCluster
        from redis.asyncio.connection import Connection, SSLConnection

        packing = HiredisPacking.connection_class(SSLConnection if target.ssl else Connection)
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(h, p, connection_class=packing) for h, p in target.nodes],
            ssl=target.ssl,
            max_connections=max_connections,
            retry=ClusterRetries.none(Retry),
            **_auth(target),
            **_timeouts(timeout),
        )
        cluster.nodes_manager.connection_kwargs["connection_class"] = packing  # the nodes it discovers
        ClusterFcallKeys.install(cluster, sync=False)
        return cluster
    common = _common(timeout, Retry, aredis.ConnectionError, aredis.ReadOnlyError)
    if target.kind == "standalone":  # a blocking pool: more tasks than connections wait their turn
        pool = aredis.BlockingConnectionPool.from_url(
            target.url, max_connections=max_connections, timeout=timeout, **common
        )
        pool.connection_class = HiredisPacking.connection_class(pool.connection_class)
        return aredis.Redis.from_pool(pool)  # closing the client closes the pool
    from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection, SentinelManagedSSLConnection

    base = SentinelManagedSSLConnection if target.ssl else SentinelManagedConnection
    connection_class = HiredisPacking.connection_class(SentinelReconnectToMaster.asyncio(base))
    return _master(target, SentinelNewestMaster.asyncio(Sentinel), connection_class, max_connections, common)
