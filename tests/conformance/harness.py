"""The stores under test, opened by name, each behind one ``call(method, *args)``.

A store joins the suite by adding its name to ``STORES`` (with its service marker) and a
branch to ``_open``. Stores are imported only when opened, so a store that does not exist
yet fails its own parameters and nothing else. Async stores run on a private event loop
(``asyncio.Runner``) kept for the harness's life: the thin async shell of the session.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

__all__ = ["POSTGRES_URL", "REDIS_URL", "STORES", "StoreHarness", "delete_redis_keys", "drop_schema", "open_harness"]

REDIS_URL = "redis://127.0.0.1:6379/0"
POSTGRES_URL = "postgresql://127.0.0.1:5432/test"

STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("memory-async", id="memory-async"),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
    pytest.param("redis-async", id="redis-async", marks=pytest.mark.redis),
    pytest.param("redis-cluster", id="redis-cluster", marks=pytest.mark.redis),
    pytest.param("redis-cluster-async", id="redis-cluster-async", marks=pytest.mark.redis),
    pytest.param("redis-sentinel", id="redis-sentinel", marks=pytest.mark.redis),
    pytest.param("redis-sentinel-async", id="redis-sentinel-async", marks=pytest.mark.redis),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    pytest.param("postgres-async", id="postgres-async", marks=pytest.mark.postgres),
    pytest.param("service", id="service", marks=pytest.mark.redis),
    pytest.param("service-async", id="service-async", marks=pytest.mark.redis),
]


class StoreHarness:
    """One store under test: ``call(method, *args)`` runs a ``Store`` method on it,
    awaited on the harness's loop when the store is async."""

    def __init__(self, name: str, store: Any, runner: asyncio.Runner | None, cleanup: Callable[[], None]) -> None:
        self.name = name
        self.store = store
        self.runner = runner
        self._cleanup = cleanup
        self.sessions = 0
        self.reopen: Callable[[], Any] | None = None
        self.namespace = ""
        """Put before every session's name where the store is shared beyond this harness
        (the service's store serves every harness of the test run)."""

    def call(self, method: str, *args: Any) -> Any:
        result = getattr(self.store, method)(*args)
        return result if self.runner is None else self.runner.run(result)

    def tag(self) -> str:
        """Begin a session: a name unique to it on this store (its rules and keys carry it).

        An in-process store is opened afresh for each session, so its sweeps (timed by
        the explicit ``now`` of the traces before) never depend on earlier sessions and a
        failing trace fails again when hypothesis replays it alone.
        """
        self.sessions += 1
        if self.reopen is not None:
            self.store = self.reopen()
        return f"{self.namespace}s{self.sessions}"

    def close(self) -> None:
        try:
            if self.runner is None:
                self.store.close()
            else:
                self.runner.run(self.store.aclose())
                self.runner.close()
        finally:
            self._cleanup()


def open_harness(name: str, fixture: Callable[[str], str]) -> StoreHarness:
    """Open the store ``name`` ("redis-async", ...) and make one call on it (see ``_warm_up``);
    ``fixture(name)`` gives the URL of a private server (``redis_cluster_url``, ``sentinel_url``)."""
    harness = _open_harness(name, fixture)
    try:
        _warm_up(harness)
    except BaseException:
        harness.close()
        raise
    return harness


def harness_of(request: Any) -> Iterator[StoreHarness]:
    """The body of a module-scoped ``harness`` fixture parametrized by store names: the
    harness of ``request.param``, closed at the end. The private servers of
    tests/server_fixtures.py (a three-master cluster, a Sentinel set) are started only when
    a parameter that needs them runs."""

    def fixture(name: str) -> str:
        url: str = request.getfixturevalue(name)
        return url

    opened = open_harness(request.param, fixture)
    try:
        yield opened
    finally:
        opened.close()


def _warm_up(harness: StoreHarness) -> None:
    """One peek before any example: a pool fills itself in a background thread, and
    psycopg_pool draws from the global ``random`` there (connection expiry jitter), which
    hypothesis would blame on the strategy that happened to be drawing at that moment."""
    from ratekeeper.op import Op
    from ratekeeper.rule import Rule

    harness.call("decide", Op.peek(Rule("conformance-warm-up", ["1/second"]).plan, "warm-up", 1))
    wait = getattr(getattr(harness.store, "pool", None), "wait", None)
    if wait is not None:  # psycopg_pool: until every min_size connection is open
        waited = wait()
        if inspect.isawaitable(waited) and harness.runner is not None:
            harness.runner.run(waited)


def _open_harness(name: str, fixture: Callable[[str], str]) -> StoreHarness:
    base, is_async = (name[: -len("-async")], True) if name.endswith("-async") else (name, False)
    url, options, cleanup = _open(base, fixture)
    if not is_async:
        from ratekeeper.stores.url import open_store

        harness = StoreHarness(name, open_store(url, **options), None, cleanup)
        if base == "service":
            harness.namespace = f"{uuid.uuid4().hex[:8]}."
        if base == "memory":
            harness.reopen = lambda: open_store(url, **options)
        return harness
    from ratekeeper.stores.url import open_async_store

    runner = asyncio.Runner()

    async def opened() -> Any:
        return open_async_store(url, **options)

    try:
        store = runner.run(opened())
    except BaseException:
        runner.close()
        cleanup()
        raise
    harness = StoreHarness(name, store, runner, cleanup)
    if base == "service":
        harness.namespace = f"{uuid.uuid4().hex[:8]}."
    if base == "memory":
        harness.reopen = lambda: open_async_store(url, **options)  # no I/O: needs no running loop
    return harness


def _nothing() -> None:
    pass


def _open(base: str, fixture: Callable[[str], str]) -> tuple[str, dict[str, Any], Callable[[], None]]:
    """The URL, options and cleanup of one store kind."""
    unique = uuid.uuid4().hex[:12]
    # The suite compares decisions, not timing: a server store gets a generous timeout, so a
    # call queued on a loaded machine is decided (a timeout mid-trace would end the trace).
    slow = {"timeout": 10}
    if base == "memory":
        # One stripe: which keys share a stripe (and its expiry) then never depends on the
        # per-process string hash, so a failing trace fails again when hypothesis replays it.
        return "memory://", {"stripes": 1}, _nothing
    if base == "redis":
        prefix = f"rk-conformance-{unique}:"
        return REDIS_URL, {"prefix": prefix, **slow}, lambda: delete_redis_keys(prefix)
    if base == "redis-cluster":  # private servers
        return fixture("redis_cluster_url"), {"prefix": f"rk-conformance-{unique}:", **slow}, _nothing
    if base == "redis-sentinel":
        return fixture("sentinel_url"), {"prefix": f"rk-conformance-{unique}:", **slow}, _nothing
    if base == "postgres":
        schema = f"rk_conformance_{unique}"
        return POSTGRES_URL, {"schema": schema, **slow}, lambda: drop_schema(schema)
    if base == "service":
        # A private service over Redis (server_fixtures.service_url); each harness's rules
        # and keys are its own (StoreHarness.namespace).
        return fixture("service_url"), slow, _nothing
    raise ValueError(f"unknown store {base!r}")


def delete_redis_keys(prefix: str) -> None:
    """Delete the keys under ``prefix`` on the shared Redis (SCAN, never KEYS or FLUSH)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        batch = []
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
    finally:
        client.close()


def drop_schema(schema: str) -> None:
    """Drop the schema this suite created on the shared PostgreSQL."""
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
