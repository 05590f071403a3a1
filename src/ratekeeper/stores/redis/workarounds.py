"""Every place the Redis store works around redis-py's behaviour, one class each.

Each class names the upstream behaviour it works around and the redis-py version it applies
to: 7.4, the version the tests run against. ``tests/redis_store/test_workarounds.py`` holds
one test per class that fails once redis-py behaves otherwise, so that a workaround is
revised or dropped when redis-py changes, never left to do harm. redis-py is imported
inside the methods: the store imports it only when one is opened.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BlockingPoolExhaustion",
    "ClusterFcallKeys",
    "ClusterLostConnections",
    "ClusterRetries",
    "HiredisPacking",
    "SentinelNewestMaster",
    "SentinelReadDisconnect",
    "SentinelReconnectToMaster",
    "SentinelsLeftOpen",
]


class HiredisPacking:
    """redis-py 7.4's asyncio connections pack commands in Python, joining a growing buffer
    once per argument, while its blocking ones pack with hiredis (``HiredisRespSerializer``).
    A coalesced call of 50 decisions has about 600 arguments, so packing cost the asyncio
    store more than the rest of its Python. ``connection_class`` packs with hiredis by the
    same rules (a command name with a space is split; an argument hiredis cannot pack is
    redis-py's ``DataError``)."""

    @staticmethod
    def connection_class(base: Any) -> Any:
        """``base`` (a redis-py asyncio connection class) packing with hiredis; without
        hiredis, ``base`` as it is."""
        try:
            import hiredis
        except ImportError:  # pragma: no cover - the redis extra installs it
            return base
        from redis.exceptions import DataError

        pack = hiredis.pack_command

        class HiredisPackingConnection(base):  # type: ignore[misc]
            def pack_command(self, *args: Any) -> list[bytes]:
                if isinstance(args[0], str):
                    args = (*args[0].encode().split(), *args[1:])
                elif b" " in args[0]:
                    args = (*args[0].split(), *args[1:])
                try:
                    return [pack(args)]
                except TypeError as exc:
                    raise DataError(str(exc)) from exc

        HiredisPackingConnection.__name__ = HiredisPackingConnection.__qualname__ = f"HiredisPacking{base.__name__}"
        return HiredisPackingConnection


class SentinelReconnectToMaster:
    """redis-py 7.4's Sentinel-managed connections ask the sentinels for the master only in
    ``connect()``. A connection dropped after "The previous master is now a slave"
    reconnects from ``send_packed_command`` through ``connect_check_health``, to the host
    and port it had: the old master, now a replica, where every retry met READONLY again.
    The connection class from ``sync`` / ``asyncio`` looks the master up there too."""

    @staticmethod
    def sync(base: Any) -> Any:
        """``base`` (redis-py's blocking ``SentinelManagedConnection`` or its SSL twin)."""

        class ReconnectToMaster(base):  # type: ignore[misc]
            def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
                if self._sock is None and self.connection_pool.is_master:
                    self.host, self.port = self.connection_pool.get_master_address()
                super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)

        return ReconnectToMaster

    @staticmethod
    def asyncio(base: Any) -> Any:
        """``base`` (redis-py's asyncio ``SentinelManagedConnection`` or its SSL twin)."""

        class AsyncReconnectToMaster(base):  # type: ignore[misc]
            async def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
                if not self.is_connected and self.connection_pool.is_master:
                    self.host, self.port = await self.connection_pool.get_master_address()
                await super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)

        return AsyncReconnectToMaster


class SentinelReadDisconnect:
    """redis-py 7.4's blocking ``SentinelManagedConnection.read_response`` defaults
    ``disconnect_on_error`` to False (a plain ``Connection``'s default is True): a read that
    timed out left the connection open with the reply still to come, and the next call on
    it read that reply as its own. ``sync`` restores the plain connection's default."""

    @staticmethod
    def sync(base: Any) -> Any:
        """``base`` (a blocking Sentinel-managed connection class)."""

        class ReadDisconnect(base):  # type: ignore[misc]
            def read_response(
                self, disable_decoding: bool = False, *, disconnect_on_error: bool = True, push_request: bool = False
            ) -> Any:
                return super().read_response(
                    disable_decoding=disable_decoding,
                    disconnect_on_error=disconnect_on_error,
                    push_request=push_request,
                )

        return ReadDisconnect


class SentinelNewestMaster:
    """redis-py 7.4's ``Sentinel.discover_master`` trusts the first sentinel that names a
    master. After a failover, the sentinels that did not run it learn of it only from the
    next hello messages (every 2 s), and until then name the old master, now a read-only
    replica: every retry of a write went back to it, and the caller saw "The previous
    master is now a slave". The ``Sentinel`` class from ``sync`` / ``asyncio`` asks every
    sentinel and trusts the answer with the newest ``config-epoch``."""

    @staticmethod
    def _pick(sentinel: Any, service: str, masters: Any, answers: list[tuple[int, str, int]]) -> None:
        state = masters.get(service)
        if state and sentinel.check_master_state(state, service):
            host = sentinel._force_master_ip if sentinel._force_master_ip is not None else state["ip"]
            answers.append((int(state.get("config-epoch", 0)), host, state["port"]))

    @staticmethod
    def _newest(answers: list[tuple[int, str, int]], service: str, errors: list[str]) -> tuple[str, int]:
        if not answers:
            from redis.sentinel import MasterNotFoundError

            raise MasterNotFoundError(f"No master found for {service!r}" + (f": {', '.join(errors)}" if errors else ""))
        _, host, port = max(answers, key=lambda answer: answer[0])
        return host, port

    @staticmethod
    def _failures() -> tuple[type[BaseException], ...]:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        return (RedisConnectionError, RedisTimeoutError)

    @classmethod
    def sync(cls, base: Any) -> Any:
        """``base``: redis-py's blocking ``Sentinel``."""
        failures, pick, newest = cls._failures(), cls._pick, cls._newest

        class NewestMaster(base):  # type: ignore[misc]
            def discover_master(self, service_name: str) -> tuple[str, int]:
                answers: list[tuple[int, str, int]] = []
                errors: list[str] = []
                for sentinel in self.sentinels:
                    try:
                        pick(self, service_name, sentinel.sentinel_masters(), answers)
                    except failures as exc:
                        errors.append(f"{sentinel} - {exc!r}")
                return newest(answers, service_name, errors)

        return NewestMaster

    @classmethod
    def asyncio(cls, base: Any) -> Any:
        """``base``: redis-py's asyncio ``Sentinel``."""
        failures, pick, newest = cls._failures(), cls._pick, cls._newest

        class AsyncNewestMaster(base):  # type: ignore[misc]
            async def discover_master(self, service_name: str) -> tuple[str, int]:
                answers: list[tuple[int, str, int]] = []
                errors: list[str] = []
                for sentinel in self.sentinels:
                    try:
                        pick(self, service_name, await sentinel.sentinel_masters(), answers)
                    except failures as exc:
                        errors.append(f"{sentinel} - {exc!r}")
                return newest(answers, service_name, errors)

        return AsyncNewestMaster


class SentinelsLeftOpen:
    """redis-py 7.4's client from ``Sentinel.master_for`` closes its own pool when closed,
    never the connections its ``Sentinel`` holds to the sentinels (they found the master).
    ``close`` / ``aclose`` close them too."""

    @staticmethod
    def _sentinels(client: Any) -> Any:
        manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
        return getattr(manager, "sentinels", ())

    @classmethod
    def close(cls, client: Any) -> None:
        """After closing a blocking client (a no-op for one not behind Sentinel)."""
        for sentinel in cls._sentinels(client):
            sentinel.close()

    @classmethod
    async def aclose(cls, client: Any) -> None:
        """After closing an asyncio client (a no-op for one not behind Sentinel)."""
        for sentinel in cls._sentinels(client):
            await sentinel.aclose()


class ClusterFcallKeys:
    """redis-py 7.4's Cluster clients find which keys a command names (to route it to their
    slot) with ``commands_parser.get_keys``, which asks the server (``COMMAND GETKEYS``,
    one more round trip per call) for every command flagged ``movablekeys``, as ``FCALL``
    is; it reads ``EVAL`` / ``EVALSHA`` keys from ``numkeys`` itself. ``install`` makes the
    client's parser read an ``FCALL``'s keys the same way (its pipelines share the parser)."""

    @staticmethod
    def keys(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """An ``FCALL``'s keys from its ``numkeys``; None for any other command."""
        if str(args[0]).upper() in ("FCALL", "FCALL_RO") and len(args) >= 3:
            return tuple(args[3 : 3 + int(args[2])]) or None
        return None

    @classmethod
    def install(cls, client: Any, sync: bool) -> None:
        """On ``client`` (a blocking ``RedisCluster`` if ``sync``, else an asyncio one)."""
        parser = client.commands_parser
        get_keys = parser.get_keys
        keys = cls.keys

        if sync:

            def sync_keys(redis_conn: Any, *args: Any) -> Any:
                found = keys(args)
                return found if found is not None else get_keys(redis_conn, *args)

            parser.get_keys = sync_keys
            return

        async def async_keys(*args: Any) -> Any:
            found = keys(args)
            return found if found is not None else await get_keys(*args)

        parser.get_keys = async_keys


class ClusterRetries:
    """redis-py 7.4's Cluster clients retry timeouts (``RedisCluster.ERRORS_ALLOW_RETRY``; a
    script that timed out may have run, so it would charge twice) and, in a pipeline, send
    again the calls whose reply was an empty list (a refund), sleeping 0.25 s between
    attempts. ``none`` is a ``Retry`` that never retries: a failed call marks the topology
    stale, and the next call finds it again."""

    @staticmethod
    def none(retry_class: Any) -> Any:
        """A ``retry_class`` (blocking or asyncio ``Retry``) without retries."""
        from redis.backoff import NoBackoff

        return retry_class(NoBackoff(), 0)


class ClusterLostConnections:
    """redis-py 7.4's asyncio ``ClusterNode.execute_command`` and ``execute_pipeline`` do not
    give back a connection whose connect or send raised: it is neither free nor connected,
    and after ``max_connections`` such failures the node refused every call for good, even
    once it was back ("Too many connections"). ``reclaim`` gives each node back the
    connections it lost."""

    @staticmethod
    def reclaim(client: Any) -> None:
        """Call it only when no call of ``client`` is under way (after a failure, and before
        closing it). Other clients (standalone, Sentinel, the blocking Cluster) have no such
        nodes: nothing happens."""
        get_nodes = getattr(client, "get_nodes", None)
        if get_nodes is None:
            return
        for node in get_nodes():
            connections, free = getattr(node, "_connections", None), getattr(node, "_free", None)
            if connections is None or free is None:
                continue
            free_ids = {id(c) for c in free}
            # not free and not connected: lost by a failed connect (a connected one may still
            # be finishing a read for a pipeline that already failed: it returns on its own)
            kept = [c for c in connections if id(c) in free_ids or getattr(c, "is_connected", True)]
            kept_ids = {id(c) for c in kept}
            # and a free one it no longer lists (it came back after an earlier reclaim) is
            # listed again, so that closing the client closes it
            connections[:] = kept + [c for c in free if id(c) not in kept_ids]


class BlockingPoolExhaustion:
    """redis-py 7.4's ``BlockingConnectionPool`` says it ran out of connections (after
    waiting its timeout) with a plain ``ConnectionError("No connection available.")``, the
    class it raises for an unreachable server, where the other pools raise
    ``MaxConnectionsError``. ``matches`` tells the two apart: an exhausted pool is this
    process's load, not Redis down."""

    @staticmethod
    def matches(exc: BaseException) -> bool:
        import redis.exceptions as rexc

        return isinstance(exc, rexc.MaxConnectionsError) or (
            type(exc) is rexc.ConnectionError and str(exc).startswith("No connection available")
        )
