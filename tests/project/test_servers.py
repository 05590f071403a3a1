"""Self-tests of the throwaway servers in ``servers.py``: each starts, answers, and comes
back on the same port after a stop, and the cluster and sentinel set behave as their
users rely on (all slots served, a failover moves the master).
"""

from __future__ import annotations

import threading

import psycopg
import pytest
import redis

from server_fixtures import start_or_skip
from servers import (
    PostgresServer,
    RedisCluster,
    RedisServer,
    SentinelSet,
    ServerError,
    ServerUnavailable,
    require_binary,
    wait_until,
)


def test_redis_server_restarts_on_the_same_port_empty(redis_server: RedisServer) -> None:
    port = redis_server.port
    with redis_server.client() as conn:
        conn.set("k", "v")
        assert conn.get("k") == b"v"
    redis_server.restart()
    assert redis_server.port == port
    with redis.Redis.from_url(redis_server.url) as conn:
        assert conn.get("k") is None  # no persistence: a restart forgets everything


def test_redis_server_stop_refuses_connections_until_started(redis_server: RedisServer) -> None:
    redis_server.stop()
    assert not redis_server.is_running()
    with redis_server.client(timeout=0.5) as conn, pytest.raises(redis.ConnectionError):
        conn.ping()
    redis_server.start()
    with redis_server.client() as conn:
        assert conn.ping() is True


def test_paused_redis_server_times_out_then_answers_after_resume(redis_server: RedisServer) -> None:
    with redis_server.client(timeout=0.3) as conn:
        conn.ping()
        redis_server.pause()
        with pytest.raises(redis.TimeoutError):
            conn.ping()
        redis_server.resume()
        conn.connection_pool.disconnect()
        assert conn.ping() is True


def test_killed_redis_server_is_restarted_by_start(redis_server: RedisServer) -> None:
    redis_server.kill()
    assert not redis_server.is_running()
    redis_server.start()
    assert redis_server.is_running()


def test_closing_a_redis_server_ends_its_process_and_removes_its_directory() -> None:
    server = RedisServer()
    pid, directory = server.pid, server.dir
    server.close()
    assert pid is not None
    assert not server.is_running()
    assert not directory.exists()


def test_cluster_serves_every_slot_and_routes_keys_through_redis_py(redis_cluster: RedisCluster) -> None:
    for node in redis_cluster.nodes:
        with node.client() as conn:
            assert "cluster_state:ok" in conn.execute_command("CLUSTER", "INFO").decode()
    key = "rk-test-servers:{tag}"
    owner = redis_cluster.node_for_key(key)
    with owner.client() as conn:
        conn.set(key, "on-its-node", px=60_000)
    with redis_cluster.client() as cluster:
        assert cluster.get(key) == b"on-its-node"
        cluster.delete(key)
    assert redis_cluster.url == "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in redis_cluster.ports)


def test_cluster_spreads_slots_over_all_three_masters(redis_cluster: RedisCluster) -> None:
    owners = {redis_cluster.node_for_slot(slot).port for slot in (0, 8000, 16383)}
    assert owners == set(redis_cluster.ports)


def test_sentinel_failover_moves_the_master_and_demotes_the_old_one(fresh_sentinel_set: SentinelSet) -> None:
    sentinels = fresh_sentinel_set
    old = sentinels.master_port()
    new = sentinels.failover()
    assert new != old
    assert sentinels.master_port() == new
    with sentinels.server_on(old).client() as conn:
        assert conn.execute_command("ROLE")[0] == b"slave"
    sentinel = redis.sentinel.Sentinel(sentinels.sentinel_addresses(), socket_timeout=1.0)
    assert sentinel.discover_master("mymaster") == ("127.0.0.1", new)
    ports = ",".join(f"127.0.0.1:{p}" for p in sentinels.sentinel_ports)
    assert sentinels.sentinel_url() == f"redis+sentinel://{ports}/mymaster"


def test_postgres_server_answers_and_keeps_its_data_across_restart(fresh_postgres_server: PostgresServer) -> None:
    server = fresh_postgres_server
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (v int)")
        conn.execute("INSERT INTO t VALUES (42)")
    port = server.port
    server.restart()
    assert server.port == port
    with psycopg.connect(server.url, autocommit=True) as conn:
        assert conn.execute("SELECT v FROM t").fetchall() == [(42,)]
        assert conn.execute("SHOW fsync").fetchone() == ("off",)


def test_postgres_server_logs_detected_deadlocks(fresh_postgres_server: PostgresServer) -> None:
    """``log_text()`` is where a test counts "deadlock detected" (deadlock_timeout is 100 ms)."""
    server = fresh_postgres_server
    with psycopg.connect(server.url, autocommit=True) as setup:
        setup.execute("CREATE TABLE d (id int primary key, v int)")
        setup.execute("INSERT INTO d VALUES (1, 0), (2, 0)")
    with psycopg.connect(server.url) as a, psycopg.connect(server.url) as b:
        a.execute("UPDATE d SET v = 1 WHERE id = 1")
        b.execute("UPDATE d SET v = 1 WHERE id = 2")
        a.execute("SET statement_timeout = '5s'")
        errors: list[BaseException] = []

        def lock_second() -> None:
            try:
                a.execute("UPDATE d SET v = 2 WHERE id = 2")
            except psycopg.Error as exc:
                errors.append(exc)

        waiter = threading.Thread(target=lock_second)
        waiter.start()
        try:
            b.execute("UPDATE d SET v = 2 WHERE id = 1")
        except psycopg.errors.DeadlockDetected as exc:
            errors.append(exc)
        b.rollback()
        waiter.join(10)
        a.rollback()
    assert any(isinstance(e, psycopg.errors.DeadlockDetected) for e in errors)
    assert server.log_text().count("deadlock detected") >= 1


def test_postgres_server_stopped_immediately_recovers_on_start(fresh_postgres_server: PostgresServer) -> None:
    server = fresh_postgres_server
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE r (v int)")
    server.stop(mode="immediate")
    assert not server.is_running()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(server.url, connect_timeout=2)
    server.start()
    with psycopg.connect(server.url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM r").fetchone() == (0,)


def test_bad_stop_mode_is_refused_with_the_accepted_ones(fresh_postgres_server: PostgresServer) -> None:
    with pytest.raises(ValueError, match="'fast', 'immediate' or 'smart'"):
        fresh_postgres_server.stop(mode="now")


def test_wait_until_gives_up_with_what_it_waited_for() -> None:
    with pytest.raises(ServerError, match="the impossible"):
        wait_until(lambda: False, 0.05, "the impossible")


def test_paused_postgres_server_answers_nothing_until_resumed(fresh_postgres_server: PostgresServer) -> None:
    server = fresh_postgres_server
    with psycopg.connect(server.url, autocommit=True) as conn:
        server.pause()
        try:
            with pytest.raises(psycopg.OperationalError):
                psycopg.connect(server.url, connect_timeout=1)
        finally:
            server.resume()
        assert conn.execute("SELECT 1").fetchone() == (1,)


def _no_binary() -> RedisServer:
    raise ServerUnavailable("redis-server is not on PATH (install it: apt-get install redis-server)")


def test_a_missing_binary_skips_the_test_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RATEKEEPER_REQUIRE_SERVICES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="redis-server is not on PATH"):
        start_or_skip(_no_binary)


def test_a_missing_binary_fails_the_test_when_services_are_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATEKEEPER_REQUIRE_SERVICES", "1")
    with pytest.raises(pytest.fail.Exception, match="RATEKEEPER_REQUIRE_SERVICES=1 forbids skipping"):
        start_or_skip(_no_binary)


def test_require_binary_names_what_is_missing_and_how_to_install_it() -> None:
    with pytest.raises(ServerUnavailable, match="no-such-server-binary is not on PATH"):
        require_binary("no-such-server-binary")
