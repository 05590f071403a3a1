"""Redis URLs → redis-py clients (sync and asyncio), one parser for both.

- ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS), ``valkey://``,
  ``valkeys://`` (TLS), ``unix:///path/to.sock[?db=N]``
- ``redis+sentinel://[[user]:password@]host:port[,host:port…]/service_name[/db]``
- ``redis+cluster://[[user]:password@]host:port[,host:port…]``

Store options (``prefix``, ``timeout``, ``batching``, ``max_in_flight``, ``max_batch``,
``max_connections``) may come from the query string or as keywords; anything else is
refused with the list of accepted options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ratekeeper.errors import ConfigurationError

__all__ = ["OPTIONS", "REDIS_SCHEMES", "RedisTarget", "parse_redis_url"]

REDIS_SCHEMES = ("redis", "rediss", "valkey", "valkeys", "unix", "redis+sentinel", "redis+cluster")
OPTIONS = ("prefix", "timeout", "batching", "max_in_flight", "max_batch", "max_connections")


@dataclass(frozen=True)
class RedisTarget:
    """Where the store connects: a standalone server, a Sentinel service or a Cluster."""

    kind: str  # "standalone" | "sentinel" | "cluster"
    url: str = ""  # standalone: a URL redis-py's from_url understands
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    def sync_client(self, timeout: float, max_connections: int) -> Any:
        """A redis-py client. A timed-out call is never sent again (the script may have run:
        sending it again could charge twice, and would triple the time a caller waits); a
        refused or broken connection is retried twice (a restarted server, a failover)."""
        import redis
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        common: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(ExponentialBackoff(cap=0.05, base=0.005), 2, (redis.exceptions.ConnectionError,)),
            "retry_on_error": [redis.exceptions.ConnectionError, redis.exceptions.ReadOnlyError],
        }
        if self.kind == "standalone":  # a blocking pool: more threads than connections wait their turn
            pool = redis.BlockingConnectionPool.from_url(
                self.url, max_connections=max_connections, timeout=timeout, **common
            )
            return redis.Redis.from_pool(pool)  # closing the client closes the pool
        if self.kind == "sentinel":
            from redis.sentinel import Sentinel

            auth = {"username": self.username, "password": self.password}
            sentinel = _latest_master(Sentinel, sync=True)(
                list(self.nodes),
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout},
            )
            from redis.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection

            return sentinel.master_for(
                self.service,
                db=self.db,
                ssl=self.ssl,
                max_connections=max_connections,
                connection_class=_to_current_master(
                    SentinelManagedSSLConnection if self.ssl else SentinelManagedConnection, sync=True
                ),
                **auth,
                **common,
            )
        from redis.cluster import ClusterNode, RedisCluster

        client = RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in self.nodes],  # type: ignore[no-untyped-call]
            username=self.username,
            password=self.password,
            ssl=self.ssl,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            max_connections=max_connections,
            retry=_no_retry(Retry),
        )
        parser = client.commands_parser
        parser.get_keys = _fcall_keys(parser.get_keys, sync=True)  # type: ignore[method-assign] # pipelines share it
        return client

    def async_client(self, timeout: float, max_connections: int) -> Any:
        """The asyncio twin of ``sync_client``, with the same retries."""
        import redis.asyncio as aredis
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff

        common: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(ExponentialBackoff(cap=0.05, base=0.005), 2, (aredis.ConnectionError,)),
            "retry_on_error": [aredis.ConnectionError, aredis.ReadOnlyError],
        }
        if self.kind == "standalone":  # a blocking pool: more tasks than connections wait their turn
            apool = aredis.BlockingConnectionPool.from_url(
                self.url, max_connections=max_connections, timeout=timeout, **common
            )
            apool.connection_class = _hiredis_packing(apool.connection_class)
            return aredis.Redis.from_pool(apool)  # closing the client closes the pool
        if self.kind == "sentinel":
            from redis.asyncio.sentinel import Sentinel

            sentinel = _latest_master(Sentinel, sync=False)(
                list(self.nodes),
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout},
            )
            from redis.asyncio.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection

            return sentinel.master_for(
                self.service,
                db=self.db,
                ssl=self.ssl,
                max_connections=max_connections,
                connection_class=_hiredis_packing(
                    _to_current_master(
                        SentinelManagedSSLConnection if self.ssl else SentinelManagedConnection, sync=False
                    )
                ),
                username=self.username,
                password=self.password,
                **common,
            )
        from redis.asyncio.cluster import ClusterNode, RedisCluster
        from redis.asyncio.connection import Connection, SSLConnection

        packing = _hiredis_packing(SSLConnection if self.ssl else Connection)
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(h, p, connection_class=packing) for h, p in self.nodes],
            username=self.username,
            password=self.password,
            ssl=self.ssl,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            max_connections=max_connections,
            retry=_no_retry(Retry),
        )
        cluster.nodes_manager.connection_kwargs["connection_class"] = packing  # the nodes it discovers
        parser = cluster.commands_parser
        parser.get_keys = _fcall_keys(parser.get_keys, sync=False)  # type: ignore[method-assign]
        return cluster


def _fcall_keys(get_keys: Any, sync: bool) -> Any:
    """redis-py's Cluster ``get_keys`` (which keys a command names, to route it to their
    slot), reading an ``FCALL``'s keys from its ``numkeys`` as redis-py does for
    ``EVALSHA``. redis-py asks the server (``COMMAND GETKEYS``, one more round trip per
    call) for every command flagged ``movablekeys``, and ``FCALL`` is one."""

    def keys(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if str(args[0]).upper() in ("FCALL", "FCALL_RO") and len(args) >= 3:
            return tuple(args[3 : 3 + int(args[2])]) or None
        return None

    if sync:

        def sync_keys(redis_conn: Any, *args: Any) -> Any:
            found = keys(args)
            return found if found is not None else get_keys(redis_conn, *args)

        return sync_keys

    async def async_keys(*args: Any) -> Any:
        found = keys(args)
        return found if found is not None else await get_keys(*args)

    return async_keys


def _hiredis_packing(base: Any) -> Any:
    """``base`` (a redis-py asyncio connection class) packing commands with hiredis.

    redis-py's asyncio connections pack in Python, joining the growing buffer once per
    argument: a coalesced call of 50 decisions (about 600 arguments) took 2.7 ms to pack,
    45 % of the whole asyncio path. The blocking client already packs with hiredis
    (``HiredisRespSerializer``); this does the same, with the same rules (a command name
    with a space is split; an argument hiredis cannot pack is redis-py's ``DataError``).
    Without hiredis, ``base`` as it is.
    """
    try:
        import hiredis
    except ImportError:  # pragma: no cover - the redis extra installs it
        return base
    from redis.exceptions import DataError

    pack = hiredis.pack_command

    class HiredisPacking(base):  # type: ignore[misc]
        def pack_command(self, *args: Any) -> list[bytes]:
            if isinstance(args[0], str):
                args = (*args[0].encode().split(), *args[1:])
            elif b" " in args[0]:
                args = (*args[0].split(), *args[1:])
            try:
                return [pack(args)]
            except TypeError as exc:
                raise DataError(str(exc)) from exc

    HiredisPacking.__name__ = HiredisPacking.__qualname__ = f"HiredisPacking{base.__name__}"
    return HiredisPacking


def _to_current_master(base: Any, sync: bool) -> Any:
    """``base`` (redis-py's Sentinel-managed connection) asking the sentinels for the
    master each time it reconnects, and (sync) dropped when a read fails.

    redis-py 7.4 re-resolves the master only in ``connect()``; a connection dropped after
    "The previous master is now a slave" reconnects from ``send_command`` through
    ``connect_check_health``, to the host and port it had: the old master, now a replica.
    Each retry of the call met READONLY there again and the caller saw the failover.
    """
    if sync:

        class ToCurrentMaster(base):  # type: ignore[misc]
            def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
                if self._sock is None and self.connection_pool.is_master:
                    self.host, self.port = self.connection_pool.get_master_address()
                super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)

            def read_response(
                self, disable_decoding: bool = False, *, disconnect_on_error: bool = True, push_request: bool = False
            ) -> Any:
                # redis-py's sync SentinelManagedConnection defaults disconnect_on_error to
                # False: a read that timed out left the connection open with the reply still
                # to come, and the next call on it read that reply as its own.
                return super().read_response(
                    disable_decoding=disable_decoding,
                    disconnect_on_error=disconnect_on_error,
                    push_request=push_request,
                )

        return ToCurrentMaster

    class AsyncToCurrentMaster(base):  # type: ignore[misc]
        async def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
            if not self.is_connected and self.connection_pool.is_master:
                self.host, self.port = await self.connection_pool.get_master_address()
            await super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)

    return AsyncToCurrentMaster


def _newest(answers: list[tuple[int, str, int]], service: str, errors: list[str]) -> tuple[str, int]:
    if not answers:
        from redis.sentinel import MasterNotFoundError

        raise MasterNotFoundError(f"No master found for {service!r}" + (f": {', '.join(errors)}" if errors else ""))
    _, host, port = max(answers, key=lambda answer: answer[0])
    return host, port


def _latest_master(base: Any, sync: bool) -> Any:
    """``base`` (redis-py's ``Sentinel``, sync or asyncio) asking every sentinel for the
    master and trusting the one with the newest ``config-epoch``.

    redis-py trusts the first sentinel that answers; after a failover, the sentinels
    that did not run it learn of it only from the next hello messages (every 2 s), and
    until then name the old master, now a read-only replica: every retry of a write
    went back to it, and the caller saw "The previous master is now a slave".
    """
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    failures = (RedisConnectionError, RedisTimeoutError)

    def pick(self: Any, service: str, masters: Any, answers: list[tuple[int, str, int]]) -> None:
        state = masters.get(service)
        if state and self.check_master_state(state, service):
            host = self._force_master_ip if self._force_master_ip is not None else state["ip"]
            answers.append((int(state.get("config-epoch", 0)), host, state["port"]))

    if sync:

        class LatestMaster(base):  # type: ignore[misc]
            def discover_master(self, service_name: str) -> tuple[str, int]:
                answers: list[tuple[int, str, int]] = []
                errors: list[str] = []
                for sentinel in self.sentinels:
                    try:
                        pick(self, service_name, sentinel.sentinel_masters(), answers)
                    except failures as exc:
                        errors.append(f"{sentinel} - {exc!r}")
                return _newest(answers, service_name, errors)

        return LatestMaster

    class AsyncLatestMaster(base):  # type: ignore[misc]
        async def discover_master(self, service_name: str) -> tuple[str, int]:
            answers: list[tuple[int, str, int]] = []
            errors: list[str] = []
            for sentinel in self.sentinels:
                try:
                    pick(self, service_name, await sentinel.sentinel_masters(), answers)
                except failures as exc:
                    errors.append(f"{sentinel} - {exc!r}")
            return _newest(answers, service_name, errors)

    return AsyncLatestMaster


def _no_retry(retry_class: Any) -> Any:
    """No retries for a Cluster client: redis-py's cluster retries cover timeouts (a
    script that timed out may have run: it would charge twice) and, in a pipeline, send
    again the calls whose reply was an empty list (a refund) and sleep 0.25 s between
    attempts. A failed call marks the topology stale; the next call re-discovers it."""
    from redis.backoff import NoBackoff

    return retry_class(NoBackoff(), 0)


def _nodes(netloc_hosts: str, url: str, default_port: int) -> tuple[tuple[str, int], ...]:
    nodes = []
    for part in netloc_hosts.split(","):
        host, _, port = part.strip().rpartition(":") if ":" in part else (part.strip(), "", str(default_port))
        host = host.strip("[]")
        if not host:
            raise ConfigurationError(f"{url!r}: expected host:port[,host:port...], got {netloc_hosts!r}")
        try:
            nodes.append((host, int(port)))
        except ValueError:
            raise ConfigurationError(f"{url!r}: port {port!r} is not a number") from None
    return tuple(nodes)


def parse_redis_url(url: str, **keywords: Any) -> RedisTarget:
    """Parse a Redis/Valkey URL; store options from its query and ``keywords`` (keywords win)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    query = dict(parse_qsl(parts.query))
    options = {k: v for k, v in query.items() if k in OPTIONS}
    options.update(keywords)
    passthrough = {k: v for k, v in query.items() if k not in OPTIONS}
    unknown = set(keywords) - set(OPTIONS)
    if scheme in ("redis+sentinel", "redis+cluster") and passthrough:
        unknown |= set(passthrough)
    if unknown:
        raise ConfigurationError(f"unknown option(s) {sorted(unknown)} for {scheme}://; accepted: {', '.join(OPTIONS)}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    user = unquote(username) or None
    secret = unquote(password) or None
    if scheme in ("redis", "rediss", "valkey", "valkeys", "unix"):
        real = {"valkey": "redis", "valkeys": "rediss"}.get(scheme, scheme)
        kept = "&".join(f"{k}={v}" for k, v in passthrough.items())
        rebuilt = f"{real}://{parts.netloc}{parts.path}" + (f"?{kept}" if kept else "")
        return RedisTarget("standalone", url=rebuilt, ssl=real == "rediss", options=options)
    if scheme == "redis+sentinel":
        path = [p for p in parts.path.split("/") if p]
        if not path or len(path) > 2:
            raise ConfigurationError(f"{url!r}: expected redis+sentinel://host:port[,host:port...]/service_name[/db]")
        try:
            db = int(path[1]) if len(path) == 2 else 0
        except ValueError:
            raise ConfigurationError(f"{url!r}: the database {path[1]!r} is not a number") from None
        return RedisTarget(
            "sentinel",
            nodes=_nodes(hosts, url, 26379),
            service=path[0],
            db=db,
            username=user,
            password=secret,
            options=options,
        )
    if scheme == "redis+cluster":
        if parts.path.strip("/"):
            raise ConfigurationError(f"{url!r}: a cluster has no databases; expected redis+cluster://host:port[,...]")
        return RedisTarget("cluster", nodes=_nodes(hosts, url, 6379), username=user, password=secret, options=options)
    raise ConfigurationError(f"{url!r} is not a Redis URL; expected one of {', '.join(REDIS_SCHEMES)}")
