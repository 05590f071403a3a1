"""A store that cannot connect says why at once (issue 9, item 8).

A wrong role, a missing database and a refused port each fail the first call within a
fraction of the timeout with a ``StoreError`` (not a ``StoreTimeout``) that carries the
server's (or the socket's) own reason; a reason retrying cannot fix also closes the pool,
so its background retries stop; ``ratekeeper migrate`` says the same and exits non-zero.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.cli import main
from ratekeeper.errors import StoreError
from ratekeeper.loadtest.process import free_port
from ratekeeper.stores.postgres.store import PostgresStore
from ratekeeper.stores.postgres.store_async import AsyncPostgresStore

pytestmark = pytest.mark.postgres

TIMEOUT = 5.0
"""The store's timeout: a refusal must come long before it."""
PROMPT = 2.0
"""Within this a refusal is reported (the first attempt fails in milliseconds)."""
RULE = Rule("connect-errors", ["5/second"])


CASES = [
    pytest.param("postgresql://nobody@127.0.0.1:5432/test", 'role "nobody" does not exist', True, id="role"),
    pytest.param("postgresql://127.0.0.1:5432/rk_no_such_db", 'database "rk_no_such_db" does not exist', True, id="db"),
    pytest.param("postgresql://127.0.0.1:{port}/test", "Connection refused", False, id="port"),
]


@pytest.mark.parametrize(("url", "reason", "final"), CASES)
def test_a_blocking_store_that_cannot_connect_says_why_at_once(url: str, reason: str, final: bool) -> None:
    store = PostgresStore(url.format(port=free_port()), timeout=TIMEOUT)
    try:
        with Limiter(store, on_error="raise") as limiter:
            for _ in range(2):  # the first call, and the next one
                started = time.monotonic()
                with pytest.raises(StoreError, match=reason) as caught:
                    limiter.try_acquire(RULE, "k")
                assert time.monotonic() - started < PROMPT
                assert type(caught.value) is StoreError  # an error, not a timeout
                assert "could not connect to PostgreSQL" in str(caught.value)
            assert store.shell.pool.closed is final  # retries stop only when they cannot help
    finally:
        store.close()


@pytest.mark.parametrize(("url", "reason", "final"), CASES)
def test_an_asyncio_store_that_cannot_connect_says_why_at_once(url: str, reason: str, final: bool) -> None:
    async def main_() -> None:
        store = AsyncPostgresStore(url.format(port=free_port()), timeout=TIMEOUT)
        limiter = AsyncLimiter(store, on_error="raise")
        try:
            started = time.monotonic()
            with pytest.raises(StoreError, match=reason) as caught:
                await limiter.try_acquire(RULE, "k")
            assert time.monotonic() - started < PROMPT
            assert type(caught.value) is StoreError
            assert store.shell.pool.closed is final
        finally:
            await limiter.aclose()

    asyncio.run(main_())


def test_allow_on_error_admits_and_the_policy_sees_a_store_error_not_a_timeout() -> None:
    store = PostgresStore("postgresql://nobody@127.0.0.1:5432/test", timeout=TIMEOUT)
    try:
        limiter = Limiter(store, on_error="allow")
        started = time.monotonic()
        decision = limiter.try_acquire(RULE, "k")
        assert decision.allowed and decision.fallback
        assert time.monotonic() - started < PROMPT
    finally:
        store.close()


@pytest.mark.parametrize(("url", "reason", "final"), CASES)
def test_migrate_says_the_servers_reason_and_exits_non_zero(
    url: str, reason: str, final: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    assert 0 != main(["migrate", "--store", f"{url.format(port=free_port())}?timeout={TIMEOUT}"])
    assert time.monotonic() - started < PROMPT + 1.0  # plus closing the pool
    err = capsys.readouterr().err
    assert reason in err
    assert "couldn't get a connection" not in err
