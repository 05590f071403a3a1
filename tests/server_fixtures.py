"""Fixtures for throwaway servers (a pytest plugin, registered in ``tests/conftest.py``).

Shared for the whole session, for tests that do not break their server (a failover
through ``SentinelSet.failover()`` leaves the set healthy again, so it counts as not
breaking it):

- ``redis_cluster`` / ``redis_cluster_url``: a private 3-master Redis Cluster.
- ``sentinel_set`` / ``sentinel_url``: a private master + replica + 3 sentinels (``mymaster``).
- ``postgres_server`` / ``postgres_url``: a private PostgreSQL 15.
- ``service_url``: a private ``ratekeeper serve`` that accepts an explicit ``now`` (the
  conformance traces), over the shared Redis under a prefix of its own (so its clock is
  one the tests can read: Redis ``TIME``): the service as a store.

One per test, for tests that stop, kill, pause or restart their server:

- ``redis_server``: a ``RedisServer``; ``fresh_redis_cluster`` (to reshard or stop);
  ``fresh_sentinel_set``; ``fresh_postgres_server``.

A test that uses any of them is marked ``redis`` or ``postgres`` automatically, so the CI
rule of ``tests/conftest.py`` applies. A missing binary skips the test with the reason,
or fails it under ``RATEKEEPER_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from servers import PostgresServer, RatekeeperService, RedisCluster, RedisServer, SentinelSet, ServerUnavailable

T = TypeVar("T")

REDIS_FIXTURES = frozenset(
    {
        "redis_server",
        "redis_cluster",
        "redis_cluster_url",
        "fresh_redis_cluster",
        "sentinel_set",
        "sentinel_url",
        "fresh_sentinel_set",
        "service_url",
    }
)
POSTGRES_FIXTURES = frozenset({"postgres_server", "postgres_url", "fresh_postgres_server"})


def start_or_skip(factory: Callable[[], T]) -> T:
    """``factory()``; a missing binary becomes a skip (a failure under RATEKEEPER_REQUIRE_SERVICES=1)."""
    try:
        return factory()
    except ServerUnavailable as exc:
        if os.environ.get("RATEKEEPER_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{exc}; RATEKEEPER_REQUIRE_SERVICES=1 forbids skipping it")
        pytest.skip(str(exc))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a server fixture with that server's marker."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & REDIS_FIXTURES and item.get_closest_marker("redis") is None:
            item.add_marker(pytest.mark.redis)
        if names & POSTGRES_FIXTURES and item.get_closest_marker("postgres") is None:
            item.add_marker(pytest.mark.postgres)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A private redis-server for this test alone (stop/kill/pause/restart it at will)."""
    with start_or_skip(RedisServer) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A private 3-master Redis Cluster shared by the session (do not stop its nodes)."""
    with start_or_skip(RedisCluster) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_cluster_url(redis_cluster: RedisCluster) -> str:
    """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`` of the session's cluster."""
    return redis_cluster.url


@pytest.fixture
def fresh_redis_cluster() -> Iterator[RedisCluster]:
    """A 3-master cluster for this test alone (about two seconds), for tests that move slots or stop nodes."""
    with start_or_skip(RedisCluster) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def sentinel_set() -> Iterator[SentinelSet]:
    """A private Sentinel set shared by the session; ``failover()`` on it is fine (it waits until healthy)."""
    with start_or_skip(SentinelSet) as sentinels:
        yield sentinels


@pytest.fixture(scope="session")
def sentinel_url(sentinel_set: SentinelSet) -> str:
    """``redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/mymaster`` of the session's set."""
    return sentinel_set.sentinel_url()


@pytest.fixture
def fresh_sentinel_set() -> Iterator[SentinelSet]:
    """A Sentinel set for this test alone (about a second to start), for tests that kill or pause nodes."""
    with start_or_skip(SentinelSet) as sentinels:
        yield sentinels


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL shared by the session (do not stop it; use ``fresh_postgres_server`` for that)."""
    with start_or_skip(PostgresServer) as server:
        yield server


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """``postgresql://postgres@127.0.0.1:PORT/postgres`` of the session's private server."""
    return postgres_server.url


@pytest.fixture
def fresh_postgres_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL for this test alone (under a second from the session's initdb copy)."""
    with start_or_skip(PostgresServer) as server:
        yield server


@pytest.fixture(scope="session")
def service_url() -> Iterator[str]:
    import uuid

    from conformance.harness import REDIS_URL, delete_redis_keys

    prefix = f"rk-service-{uuid.uuid4().hex[:12]}:"
    service = RatekeeperService(f"{REDIS_URL}?prefix={prefix}", env={"RATEKEEPER_EXPLICIT_NOW": "1"})
    try:
        yield service.admin_url
    finally:
        service.close()
        delete_redis_keys(prefix)
