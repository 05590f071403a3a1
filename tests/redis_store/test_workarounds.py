"""One test per workaround of ``stores/redis/workarounds.py``: each shows that redis-py still
behaves as the workaround says (so a redis-py release that changes it fails here, and the
workaround is revised or dropped), and that the workaround does what it says.

None needs a server but the two that read the command table or take a pooled connection
(the shared Redis on 127.0.0.1:6379).
"""

from __future__ import annotations

import asyncio
import inspect
import socket
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import ClusterNode
from redis.exceptions import ConnectionError as RedisConnectionError

from ratekeeper.stores.redis.workarounds import (
    BlockingPoolExhaustion,
    ClusterFcallKeys,
    ClusterLostConnections,
    ClusterRetries,
    HiredisPacking,
    SentinelNewestMaster,
    SentinelReadDisconnect,
    SentinelReconnectToMaster,
    SentinelsLeftOpen,
)

REDIS = ("127.0.0.1", 6379)


def _closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_hiredis_packing_asyncio_connections_pack_in_python_and_ours_pack_the_same_bytes() -> None:
    from redis.asyncio.connection import Connection

    upstream = Connection()
    assert not hasattr(upstream, "_command_packer")  # no hiredis serializer: packed in Python
    assert "_command_packer" in inspect.getsource(redis.connection.AbstractConnection.pack_command)  # blocking: hiredis
    packing = HiredisPacking.connection_class(Connection)()
    for args in (("FCALL", "f", 1, "k", 2.5, b"\xc1"), ("SCRIPT LOAD", "return 1"), (b"SCRIPT LOAD", "return 1")):
        assert b"".join(packing.pack_command(*args)) == b"".join(upstream.pack_command(*args))
    with pytest.raises(redis.DataError):
        upstream.pack_command("SET", "k", object())
    with pytest.raises(redis.DataError):
        packing.pack_command("SET", "k", object())


class _Pool:
    """What a Sentinel-managed connection asks of its pool."""

    is_master = True
    check_connection = False

    @staticmethod
    def get_master_address() -> tuple[str, int]:
        return "new-master", 2


async def _aget_master_address() -> tuple[str, int]:
    return "new-master", 2


def test_sentinel_reconnect_goes_back_to_the_old_master_upstream_and_to_the_current_one_with_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from redis.asyncio.sentinel import SentinelManagedConnection as AsyncManaged
    from redis.sentinel import SentinelManagedConnection

    assert "connect_check_health" not in vars(SentinelManagedConnection)  # only connect() asks the sentinels
    assert "connect_check_health" not in vars(AsyncManaged)
    dialled: list[tuple[str, int]] = []

    def record(self: Any, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        dialled.append((self.host, self.port))
        raise RedisConnectionError("not dialled in this test")

    async def arecord(self: Any, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        record(self)

    monkeypatch.setattr(redis.connection.AbstractConnection, "connect_check_health", record)
    monkeypatch.setattr(redis.asyncio.connection.AbstractConnection, "connect_check_health", arecord)
    apool = SimpleNamespace(is_master=True, check_connection=False, get_master_address=_aget_master_address)
    for cls, pool in (
        (SentinelManagedConnection, _Pool),
        (SentinelReconnectToMaster.sync(SentinelManagedConnection), _Pool),
    ):
        with pytest.raises(RedisConnectionError):
            cls(connection_pool=pool, host="old-master", port=1).send_packed_command(b"PING")

    async def send_async() -> None:
        for cls in (AsyncManaged, SentinelReconnectToMaster.asyncio(AsyncManaged)):
            with pytest.raises(RedisConnectionError):
                await cls(connection_pool=apool, host="old-master", port=1).send_packed_command(b"PING")

    asyncio.run(send_async())
    # upstream (sync, asyncio) dials the address it had; ours asks for the master first
    assert dialled == [("old-master", 1), ("new-master", 2), ("old-master", 1), ("new-master", 2)]


def test_sentinel_read_keeps_the_connection_open_on_error_upstream_and_drops_it_with_ours() -> None:
    from redis.connection import Connection
    from redis.sentinel import SentinelManagedConnection

    def default(cls: Any) -> Any:
        return inspect.signature(cls.read_response).parameters["disconnect_on_error"].default

    assert default(SentinelManagedConnection) is False
    assert default(Connection) is True
    assert default(SentinelReadDisconnect.sync(SentinelManagedConnection)) is True


class _Sentinel:
    """A sentinel that names a master with a config epoch, and says whether it was closed."""

    def __init__(self, host: str, epoch: int) -> None:
        self.host, self.epoch, self.closed = host, epoch, False

    def sentinel_masters(self) -> dict[str, Any]:
        state = {"ip": self.host, "port": 6379, "is_master": True, "is_sdown": False, "is_odown": False}
        return {"svc": {**state, "num-other-sentinels": 2, "config-epoch": self.epoch}}

    def close(self) -> None:
        self.closed = True


class _AsyncSentinel(_Sentinel):
    async def sentinel_masters(self) -> dict[str, Any]:  # type: ignore[override]
        return super().sentinel_masters()


def test_sentinel_discovery_trusts_the_first_answer_upstream_and_the_newest_epoch_with_ours() -> None:
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel
    from redis.sentinel import Sentinel

    def stale_first(cls: Any, fake: type[_Sentinel]) -> Any:
        sentinel = cls([REDIS])
        sentinel.sentinels = [fake("old-master", 1), fake("new-master", 2)]
        return sentinel

    assert stale_first(Sentinel, _Sentinel).discover_master("svc") == ("old-master", 6379)
    assert stale_first(SentinelNewestMaster.sync(Sentinel), _Sentinel).discover_master("svc") == ("new-master", 6379)

    async def discover() -> list[Any]:
        return [
            await stale_first(AsyncSentinel, _AsyncSentinel).discover_master("svc"),
            await stale_first(SentinelNewestMaster.asyncio(AsyncSentinel), _AsyncSentinel).discover_master("svc"),
        ]

    assert asyncio.run(discover()) == [("old-master", 6379), ("new-master", 6379)]


def test_closing_a_sentinel_client_leaves_the_sentinels_open_upstream_and_ours_closes_them() -> None:
    from redis.sentinel import Sentinel

    sentinel = Sentinel([REDIS])
    fakes = [_Sentinel("a", 1), _Sentinel("b", 1)]
    sentinel.sentinels = fakes  # type: ignore[assignment]
    client = sentinel.master_for("svc")
    client.close()
    assert [f.closed for f in fakes] == [False, False]
    SentinelsLeftOpen.close(client)
    assert [f.closed for f in fakes] == [True, True]
    SentinelsLeftOpen.close(redis.Redis())  # not behind Sentinel: nothing to close


def test_cluster_key_lookup_asks_the_server_for_fcall_upstream_and_reads_numkeys_with_ours() -> None:
    from redis._parsers.commands import CommandsParser

    class Counting:
        def __init__(self, conn: redis.Redis) -> None:
            self.conn = conn
            self.sent: list[Any] = []

        def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            self.sent.append(args[0])
            return self.conn.execute_command(*args, **kwargs)

    with redis.Redis(*REDIS) as conn:
        parser = CommandsParser(conn)
        counting = Counting(conn)
        command = ("FCALL", "f", 2, "{t}a", "{t}b", "arg")
        assert [str(k) for k in parser.get_keys(counting, *command)] == ["{t}a", "{t}b"]
        assert counting.sent == ["COMMAND GETKEYS"]  # a round trip per call
        client = SimpleNamespace(commands_parser=parser)
        ClusterFcallKeys.install(client, sync=True)
        assert parser.get_keys(counting, *command) == ("{t}a", "{t}b")
        assert parser.get_keys(counting, "GET", "k") == ["k"]  # other commands as before
        assert counting.sent == ["COMMAND GETKEYS"]  # no more round trips


def test_cluster_clients_retry_timeouts_upstream_and_ours_never_retry() -> None:
    from redis.cluster import RedisCluster
    from redis.retry import Retry

    assert redis.exceptions.TimeoutError in RedisCluster.ERRORS_ALLOW_RETRY
    assert "retry" in inspect.signature(RedisCluster.__init__).parameters
    assert ClusterRetries.none(Retry).get_retries() == 0


def test_a_cluster_node_loses_a_connection_whose_connect_failed_upstream_and_ours_reclaims_it() -> None:
    async def run() -> tuple[int, int, int]:
        node = ClusterNode("127.0.0.1", _closed_port(), socket_connect_timeout=0.5)
        with pytest.raises(RedisConnectionError):
            await node.execute_command("PING")
        lost = (len(node._connections), len(node._free))
        ClusterLostConnections.reclaim(SimpleNamespace(get_nodes=lambda: [node]))
        await node.disconnect()
        return *lost, len(node._connections)

    listed, free, after = asyncio.run(run())
    assert (listed, free) == (1, 0)  # listed, never given back: the node's max_connections shrank by one
    assert after == 0
    ClusterLostConnections.reclaim(redis.Redis())  # other clients have no such nodes: nothing happens


def test_an_exhausted_blocking_pool_raises_a_plain_connection_error_and_ours_tells_it_apart() -> None:
    pool = redis.BlockingConnectionPool(host=REDIS[0], port=REDIS[1], max_connections=1, timeout=0.01)
    held = pool.get_connection()
    try:
        with pytest.raises(RedisConnectionError) as raised:
            pool.get_connection()
    finally:
        pool.release(held)
        pool.disconnect()

    async def exhaust_async() -> BaseException:
        apool = aredis.BlockingConnectionPool(host=REDIS[0], port=REDIS[1], max_connections=1, timeout=0.01)
        aheld = await apool.get_connection()
        try:
            with pytest.raises(RedisConnectionError) as araised:
                await apool.get_connection()
        finally:
            await apool.release(aheld)
            await apool.disconnect()
        return araised.value

    for error in (raised.value, asyncio.run(exhaust_async())):
        assert type(error) is RedisConnectionError  # the class an unreachable server raises too
        assert BlockingPoolExhaustion.matches(error)
    assert BlockingPoolExhaustion.matches(redis.exceptions.MaxConnectionsError("Too many connections"))
    assert not BlockingPoolExhaustion.matches(RedisConnectionError("Error 111 connecting to 127.0.0.1:1."))
