"""No call outlives the store's timeout, whatever the server does, and the pool recovers.

A private PostgreSQL (``fresh_postgres_server``, tests/servers.py) is paused (SIGSTOP: it
accepts nothing and answers nothing, so no ``statement_timeout`` can help), restarted and
stopped under a store with a short timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from ratekeeper import Rule
from ratekeeper.errors import StoreError, StoreTimeout
from ratekeeper.op import Op
from ratekeeper.stores.postgres.store import PostgresStore
from ratekeeper.stores.postgres.store_async import AsyncPostgresStore
from servers import PostgresServer

pytestmark = pytest.mark.postgres

TIMEOUT = 0.4
PLAN = Rule("deadline", ["1000/s"]).plan


def timed_error(call: Callable[[], object]) -> tuple[type[BaseException] | None, float]:
    started = time.monotonic()
    try:
        call()
    except StoreError as exc:
        return type(exc), time.monotonic() - started
    return None, time.monotonic() - started


def test_a_paused_server_costs_one_timeout_and_the_store_recovers(fresh_postgres_server: PostgresServer) -> None:
    server = fresh_postgres_server
    store = PostgresStore(server.url, timeout=TIMEOUT, batching=False)
    try:
        assert store.decide(Op.decide(PLAN, "k", 1))
        server.pause()
        try:
            kind, took = timed_error(lambda: store.decide(Op.decide(PLAN, "k", 1)))
        finally:
            server.resume()
        assert kind is StoreTimeout
        assert took < TIMEOUT + 0.5
        assert store.decide(Op.decide(PLAN, "k", 1))
    finally:
        store.close()


def test_after_a_restart_at_most_one_call_fails_per_pooled_connection(fresh_postgres_server: PostgresServer) -> None:
    server = fresh_postgres_server
    store = PostgresStore(server.url, timeout=TIMEOUT, batching=False, min_size=2, max_size=2)
    try:
        assert store.decide(Op.decide(PLAN, "k", 1))
        server.restart()
        outcomes = []
        for _ in range(5):
            kind, took = timed_error(lambda: store.decide(Op.decide(PLAN, "k", 1)))
            assert took < TIMEOUT + 0.5
            outcomes.append(kind)
        assert outcomes.count(None) >= 3
        assert outcomes[-1] is None
    finally:
        store.close()


def test_async_paused_server_costs_one_timeout_and_the_store_recovers(fresh_postgres_server: PostgresServer) -> None:
    server = fresh_postgres_server

    async def main() -> tuple[type[BaseException] | None, float, bool]:
        store = AsyncPostgresStore(server.url, timeout=TIMEOUT, batching=False)
        try:
            assert await store.decide(Op.decide(PLAN, "k", 1))
            server.pause()
            started = time.monotonic()
            kind: type[BaseException] | None = None
            try:
                await store.decide(Op.decide(PLAN, "k", 1))
            except StoreError as exc:
                kind = type(exc)
            finally:
                took = time.monotonic() - started
                server.resume()
            return kind, took, (await store.decide(Op.decide(PLAN, "k", 1))).allowed
        finally:
            await store.aclose()

    kind, took, recovered = asyncio.run(main())
    assert kind is StoreTimeout
    assert took < TIMEOUT + 0.5
    assert recovered
