"""The failure policy against a real PostgreSQL that stops, refuses connections, restarts
and blocks a decision past its statement timeout.

Each test starts its own server on a spare port (``fresh_postgres_server``) and keeps one
limiter across the fault: every call returns within the store's timeout plus a margin
(measured with ``time.monotonic``: a correctness bound, not a benchmark), the policy
answers, the breaker stops calling the failing store, and the pool serves again once the
server is back, without recreating anything.
"""

from __future__ import annotations

import asyncio
import threading
import time
from functools import partial
from typing import Any

import psycopg
import pytest

import fault_load
from fault_load import Progress, load, threads_through
from ratekeeper import AsyncLimiter, Decision, Limiter, Rule, StoreError, StoreTimeout
from ratekeeper.limiter.breaker import CLOSED, OPEN, CircuitBreaker
from ratekeeper.stores import wire
from ratekeeper.stores.postgres.store import PostgresStore
from ratekeeper.stores.postgres.store_async import AsyncPostgresStore
from servers import PostgresServer

pytestmark = pytest.mark.postgres

TIMEOUT = 0.3
"""The store's timeout: waiting for a pooled connection, and each statement."""
MARGIN = 0.3
"""Scheduling slack on a busy 2-core machine: a call may take TIMEOUT + MARGIN at most."""
COOL_DOWN = 0.5
RECOVERY = 15.0
"""The longest the tests wait for the pool to serve again after the server is back."""

RULE = Rule("api.reads", ["1000/s"], algorithm="gcra")
LOGIN = Rule("auth.login", ["5/minute"], algorithm="fixed_window")


class CountingPostgresStore(PostgresStore):
    """A ``PostgresStore`` that counts the decisions asked of it (those the breaker let through)."""

    calls = 0

    def decide(self, *args: Any, **kwargs: Any) -> Decision:
        self.calls += 1
        return super().decide(*args, **kwargs)


def limiter_on(
    server: PostgresServer, prefix: str, on_error: str, failures: int = 3
) -> tuple[Limiter, CountingPostgresStore]:
    store = CountingPostgresStore(server.url, prefix=f"{prefix}:", timeout=TIMEOUT)
    return Limiter(store, on_error=on_error, breaker=CircuitBreaker(failures, cool_down=COOL_DOWN)), store


wait_for_store = partial(fault_load.wait_for_store, recovery=RECOVERY, bound=TIMEOUT + MARGIN)


def stored(server: PostgresServer, prefix: str, rule: Rule, key: str) -> bool:
    """Whether the state of ``key`` under ``rule`` is a row in the server's table."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM ratekeeper.state WHERE key = %s", (wire.storage_key(f"{prefix}:", rule.plan, key),)
        ).fetchone()
    return row is not None and row[0] == 1


def test_stopped_server_the_policy_answers_fast_and_the_pool_serves_again_after_a_start(
    fresh_postgres_server: PostgresServer, key_prefix: str
) -> None:
    server = fresh_postgres_server
    limiter, store = limiter_on(server, key_prefix, "local")
    healthy, _ = load(limiter, RULE, 10)
    assert {None} == {d.fallback for d in healthy}

    server.stop()
    calls_before = store.calls
    start = time.monotonic()
    decisions, slowest = load(limiter, RULE, 100)
    probes = int((time.monotonic() - start) / COOL_DOWN) + 1
    assert slowest <= TIMEOUT + MARGIN, f"a call took {slowest:.3f}s with timeout {TIMEOUT}s"
    assert {"local"} == {d.fallback for d in decisions}
    assert OPEN == limiter.breaker.state
    # Three failures open the breaker; then at most one probe per cool-down.
    assert store.calls - calls_before <= 3 + probes
    assert limiter.failures.count("api.reads", cause="open", outcome="local") >= 100 - 3 - probes

    server.start()
    assert wait_for_store(limiter, RULE).allowed
    assert CLOSED == limiter.breaker.state
    after, _ = load(limiter, RULE, 10)
    assert {None} == {d.fallback for d in after}
    limiter.try_acquire(RULE, "after-the-start")
    assert stored(server, key_prefix, RULE, "after-the-start")
    limiter.close()


def test_a_limiter_opened_while_the_server_refuses_connections_works_once_it_accepts(
    fresh_postgres_server: PostgresServer, key_prefix: str
) -> None:
    server = fresh_postgres_server
    server.stop()
    start = time.monotonic()
    limiter, _ = limiter_on(server, key_prefix, "deny")
    assert time.monotonic() - start <= TIMEOUT + MARGIN  # opening does not wait for the server
    decisions, slowest = load(limiter, LOGIN, 20)
    assert slowest <= TIMEOUT + MARGIN, f"a call took {slowest:.3f}s with timeout {TIMEOUT}s"
    assert {(False, "deny")} == {(d.allowed, d.fallback) for d in decisions}

    server.start()
    assert wait_for_store(limiter, LOGIN).allowed
    limiter.close()


def test_a_decision_blocked_by_a_lock_ends_at_the_statement_timeout_and_the_policy_answers(
    fresh_postgres_server: PostgresServer, key_prefix: str
) -> None:
    """Another session holds ACCESS EXCLUSIVE on the state table: the decision statement
    waits for the lock until ``statement_timeout`` cancels it (``StoreTimeout``)."""
    server = fresh_postgres_server
    limiter, store = limiter_on(server, key_prefix, "deny")
    assert limiter.try_acquire(LOGIN, "user-1")  # installs the schema
    table = f"{store.planner.options.schema}.{store.planner.options.table}"

    with psycopg.connect(server.url) as blocker:
        blocker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        decisions, slowest = load(limiter, LOGIN, 20)
        blocker.rollback()

    assert slowest <= TIMEOUT + MARGIN, f"a call took {slowest:.3f}s with timeout {TIMEOUT}s"
    assert {(False, "deny")} == {(d.allowed, d.fallback) for d in decisions}
    assert limiter.failures.count("auth.login", cause="timeout", outcome="deny") == 3
    assert OPEN == limiter.breaker.state
    assert 4 == wait_for_store(limiter, LOGIN).remaining  # the store decides again: its fresh key, charged once
    limiter.close()


def test_under_raise_the_caller_sees_store_errors_only_and_each_in_time(
    fresh_postgres_server: PostgresServer, key_prefix: str
) -> None:
    """A blocked decision raises ``StoreTimeout`` (the statement timeout, chained); a
    stopped server raises ``StoreError``, then ``CircuitOpen`` once the breaker opens."""
    server = fresh_postgres_server
    limiter, store = limiter_on(server, key_prefix, "raise", failures=2)
    limiter.try_acquire(RULE, "k")
    table = f"{store.planner.options.schema}.{store.planner.options.table}"
    with psycopg.connect(server.url) as blocker:
        blocker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        start = time.monotonic()
        with pytest.raises(StoreTimeout, match="statement timeout") as info:
            limiter.try_acquire(RULE, "k")
        elapsed = time.monotonic() - start
        blocker.rollback()
    assert elapsed <= TIMEOUT + MARGIN
    assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled)
    assert limiter.try_acquire(RULE, "k").allowed  # the streak ends: closed again

    server.stop(mode="immediate")
    for _ in range(10):
        start = time.monotonic()
        with pytest.raises(StoreError):
            limiter.try_acquire(RULE, "k")
        assert time.monotonic() - start <= TIMEOUT + MARGIN
    assert {"timeout", "open"} <= {cause for (_, cause, _) in limiter.failures.counts}
    assert OPEN == limiter.breaker.state
    limiter.close()


def test_restart_mid_load_from_threads_no_error_reaches_the_callers(
    fresh_postgres_server: PostgresServer, key_prefix: str
) -> None:
    """Four threads keep deciding while the server restarts (immediate shutdown: every
    connection drops); the same limiter serves from the store again afterwards.

    A caller queued behind a statement in flight (coalescing) may wait for it first: the
    bound for a thread is two timeouts plus the margin.
    """
    server = fresh_postgres_server
    limiter, _ = limiter_on(server, key_prefix, "allow")

    def disrupt(progress: Progress) -> None:
        progress.wait_for(None, 20, RECOVERY)  # the store decides
        server.restart(mode="immediate")
        wait_for_store(limiter, RULE)
        progress.wait_for(None, 20, RECOVERY)  # the store decides again

    errors, slowest, seen = threads_through(limiter, RULE, disrupt, join=RECOVERY)
    assert [] == errors
    assert max(slowest) <= 2 * TIMEOUT + MARGIN, f"a call took {max(slowest):.3f}s"
    assert None in seen
    assert CLOSED == limiter.breaker.state
    limiter.close()


def test_async_limiter_through_a_stop_a_lock_and_a_start(
    fresh_postgres_server: PostgresServer, key_prefix: str
) -> None:
    server = fresh_postgres_server

    async def main() -> None:
        store = AsyncPostgresStore(server.url, prefix=f"{key_prefix}:", timeout=TIMEOUT)
        limiter = AsyncLimiter(store, on_error="local", breaker=CircuitBreaker(3, cool_down=COOL_DOWN))

        async def timed_batch(rule: Rule, n: int) -> tuple[list[Decision], float]:
            async def one(i: int) -> tuple[Decision, float]:
                start = time.monotonic()
                decision = await limiter.try_acquire(rule, f"user-{i % 5}")
                return decision, time.monotonic() - start

            results = await asyncio.gather(*(one(i) for i in range(n)))
            return [d for d, _ in results], max(s for _, s in results)

        healthy, _ = await timed_batch(RULE, 10)
        assert {None} == {d.fallback for d in healthy}

        table = f"{store.planner.options.schema}.{store.planner.options.table}"
        blocker = await psycopg.AsyncConnection.connect(server.url)
        await blocker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        decisions, slowest = await timed_batch(RULE, 20)
        await blocker.rollback()
        await blocker.close()
        assert slowest <= TIMEOUT + MARGIN, f"a call took {slowest:.3f}s with timeout {TIMEOUT}s"
        assert {"local"} == {d.fallback for d in decisions}

        server.stop()
        for _ in range(3):
            decisions, slowest = await timed_batch(RULE, 20)
            assert slowest <= TIMEOUT + MARGIN, f"a call took {slowest:.3f}s with timeout {TIMEOUT}s"
            assert {"local"} == {d.fallback for d in decisions}
        server.start()

        deadline = time.monotonic() + RECOVERY
        while (await limiter.try_acquire(RULE, "recovery")).fallback is not None:
            assert time.monotonic() < deadline, "the store was not used again after the start"
            await asyncio.sleep(0.05)
        after, _ = await timed_batch(RULE, 10)
        assert {None} == {d.fallback for d in after}
        await limiter.aclose()

    asyncio.run(main())


def test_paused_server_calls_end_at_the_timeout_instead_of_hanging(
    fresh_postgres_server: PostgresServer, key_prefix: str
) -> None:
    """SIGSTOP on every server process: the socket stays open, the kernel still acknowledges,
    nothing answers and the server cannot run its own statement timeout. Only the client can
    end the call. (A timer resumes the server after a few seconds, so a store that hangs
    fails this test instead of hanging the suite.)"""
    server = fresh_postgres_server
    limiter, _ = limiter_on(server, key_prefix, "deny")
    assert limiter.try_acquire(LOGIN, "user-1")
    server.pause()
    resume = threading.Timer(3.0, server.resume)
    resume.start()
    try:
        decisions, slowest = load(limiter, LOGIN, 5)
    finally:
        resume.cancel()
        server.resume()
    assert slowest <= TIMEOUT + MARGIN, f"a call took {slowest:.3f}s with timeout {TIMEOUT}s"
    assert {(False, "deny")} == {(d.allowed, d.fallback) for d in decisions}
    assert wait_for_store(limiter, LOGIN).allowed
    limiter.close()


def test_paused_server_async_calls_end_at_the_timeout(fresh_postgres_server: PostgresServer, key_prefix: str) -> None:
    server = fresh_postgres_server

    async def main() -> None:
        store = AsyncPostgresStore(server.url, prefix=f"{key_prefix}:", timeout=TIMEOUT)
        limiter = AsyncLimiter(store, on_error="allow", breaker=CircuitBreaker(3, cool_down=COOL_DOWN))
        assert (await limiter.try_acquire(RULE, "k")).fallback is None
        server.pause()
        try:
            for _ in range(3):
                start = time.monotonic()
                decision = await asyncio.wait_for(limiter.try_acquire(RULE, "k"), 5.0)
                elapsed = time.monotonic() - start
                assert elapsed <= TIMEOUT + MARGIN, f"a call took {elapsed:.3f}s with timeout {TIMEOUT}s"
                assert "allow" == decision.fallback
        finally:
            server.resume()
        deadline = time.monotonic() + RECOVERY
        while (await limiter.try_acquire(RULE, "recovery")).fallback is not None:
            assert time.monotonic() < deadline, "the store was not used again after the resume"
            await asyncio.sleep(0.05)
        await limiter.aclose()

    asyncio.run(main())
