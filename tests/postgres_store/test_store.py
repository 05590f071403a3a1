"""The PostgreSQL store's own behaviour: options, schema, expiry, errors, one round trip."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import psycopg
import pytest

from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.errors import ConfigurationError, StoreError, StoreTimeout
from ratekeeper.op import Op
from ratekeeper.stores import wire
from ratekeeper.stores.postgres.options import PostgresOptions
from ratekeeper.stores.postgres.schema import migration_sql
from ratekeeper.stores.postgres.store import PostgresStore
from ratekeeper.stores.postgres.store_async import AsyncPostgresStore
from ratekeeper.stores.url import open_async_store, open_store

from .conftest import PG_URL, drop_schema

pytestmark = pytest.mark.postgres


def rows(schema: str, table: str = "state") -> list[tuple[str, int]]:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        return conn.execute(f"SELECT key, expires_at FROM {schema}.{table} ORDER BY key").fetchall()


def wall_us() -> int:
    return time.time_ns() // 1000


# -- options ----------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["postgresql://u@h/db", "postgres://u@h/db"])
def test_both_schemes_open_the_postgres_store(url: str) -> None:
    store = open_store(url)
    try:
        assert isinstance(store, PostgresStore)
    finally:
        store.close()
    assert isinstance(open_async_store(url), AsyncPostgresStore)


def test_options_come_from_the_url_and_keywords_override_them() -> None:
    opts = PostgresOptions(
        "postgresql://u@h:5433/db?schema=limits&table=buckets&unlogged=true&timeout=0.25&sslmode=disable",
        table="other",
        max_size=3,
    )
    assert (opts.schema, opts.table, opts.unlogged, opts.timeout, opts.max_size) == (
        "limits",
        "other",
        True,
        0.25,
        3,
    )
    assert opts.conninfo == "postgresql://u@h:5433/db?sslmode=disable"


def test_unknown_option_is_refused_with_the_accepted_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown option\(s\) \['colour'\].*schema, table, unlogged"):
        PostgresOptions("postgresql://u@h/db?colour=red")
    with pytest.raises(ConfigurationError, match="unknown option"):
        PostgresOptions("postgresql://u@h/db", pool=3)


@pytest.mark.parametrize("name", ["Bad", "x;drop", "1abc", "a" * 49, ""])
def test_schema_and_table_must_be_plain_identifiers(name: str) -> None:
    with pytest.raises(ConfigurationError, match="plain lower-case SQL identifier"):
        PostgresOptions("postgresql://u@h/db", schema=name)
    with pytest.raises(ConfigurationError, match="plain lower-case SQL identifier"):
        PostgresOptions("postgresql://u@h/db", table=name)


def test_bad_numbers_and_booleans_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="timeout must be a number of seconds"):
        PostgresOptions("postgresql://u@h/db?timeout=soon")
    with pytest.raises(ConfigurationError, match="unlogged must be true or false"):
        PostgresOptions("postgresql://u@h/db?unlogged=maybe")
    with pytest.raises(ConfigurationError, match="max_size"):
        PostgresOptions("postgresql://u@h/db", min_size=5, max_size=2)


# -- schema -----------------------------------------------------------------------------


def test_first_use_creates_the_schema_and_migrating_again_changes_nothing(store: PostgresStore, schema: str) -> None:
    rule = Rule("first", ["2/s"])
    assert store.decide(Op.decide(rule.plan, "k", 1))
    store.migrate()
    store.migrate()
    assert [k for k, _ in rows(schema)] == [wire.storage_key("", rule.plan, "k")]
    assert store.decide(Op.decide(rule.plan, "k", 1)).remaining == 0


def test_stores_opened_at_once_install_the_schema_once_without_errors(pg_url: str, schema: str) -> None:
    rule = Rule("race", ["100/s"], "fixed_window")
    errors: list[BaseException] = []
    admitted: list[bool] = []

    def worker() -> None:
        store = PostgresStore(pg_url)
        try:
            admitted.append(store.decide(Op.decide(rule.plan, "k", 1)).allowed)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert admitted == [True] * 6


def test_schema_and_table_options_name_where_the_state_lives(schema: str) -> None:
    store = PostgresStore(PG_URL, schema=schema, table="limits_state")
    try:
        store.decide(Op.decide(Rule("named", ["1/s"]).plan, "k", 1))
    finally:
        store.close()
    assert len(rows(schema, "limits_state")) == 1


@pytest.mark.parametrize(("unlogged", "persistence"), [(True, "u"), (False, "p")])
def test_unlogged_option_creates_an_unlogged_table(schema: str, unlogged: bool, persistence: str) -> None:
    store = PostgresStore(PG_URL, schema=schema, unlogged=unlogged)
    try:
        store.migrate()
    finally:
        store.close()
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        row = conn.execute("SELECT relpersistence FROM pg_class WHERE oid = %s::regclass", (f"{schema}.state",))
        assert row.fetchone() == (persistence,)


def test_migrate_cli_prints_and_runs_the_sql(schema: str, capsys: pytest.CaptureFixture[str]) -> None:
    from ratekeeper.cli import main

    url = f"{PG_URL}?schema={schema}&unlogged=true"
    assert main(["migrate", "--store", url, "--print"]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == migration_sql(schema, "state", True).strip()
    assert f"CREATE UNLOGGED TABLE IF NOT EXISTS {schema}.state" in printed
    # --print touches nothing:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        assert conn.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone() == (None,)
    assert main(["migrate", "--store", url]) == 0
    assert main(["migrate", "--store", url]) == 0
    assert "up to date" in capsys.readouterr().out
    assert rows(schema) == []


def test_migrate_cli_refuses_stores_without_a_schema(capsys: pytest.CaptureFixture[str]) -> None:
    from ratekeeper.cli import main

    assert main(["migrate", "--store", "memory://"]) == 2
    assert "migrate applies to postgresql://" in capsys.readouterr().err


# -- rows and expiry --------------------------------------------------------------------


def test_a_row_expires_once_its_state_is_whole_and_the_sweep_deletes_it(store: PostgresStore, schema: str) -> None:
    rule = Rule("expiry", ["1/10s"])
    before = wall_us()
    store.decide(Op.decide(rule.plan, "k", 1))
    ((_, expires_at),) = rows(schema)
    step = 10_000_000  # expires_at moves in steps (fewer index updates): up to 10 s more, plus a second
    assert before + 10_000_000 <= expires_at <= wall_us() + 10_000_000 + 2_000_000 + step
    assert store.sweep() == 0  # not yet whole
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.state SET expires_at = 0")  # as if the time had passed
    assert store.sweep() == 1
    assert rows(schema) == []


def test_only_one_instance_sweeps_at_a_time(store: PostgresStore, schema: str) -> None:
    store.decide(Op.decide(Rule("sweep", ["1/s"]).plan, "k", 1))
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.state SET expires_at = 0")
        with conn.transaction():
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext('ratekeeper.sweep'), hashtext(%s))", (f"{schema}.state",)
            )
            assert store.sweep() == 0  # another instance holds the sweep
        assert store.sweep() == 1


def test_the_sweep_deletes_at_most_its_bound_and_skips_live_rows(store: PostgresStore, schema: str) -> None:
    plan = Rule("bound", ["1/s"]).plan
    for i in range(5):
        store.decide(Op.decide(plan, f"k{i}", 1))
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.state SET expires_at = 0 WHERE key <> %s", (wire.storage_key("", plan, "k0"),))
    assert store.sweep(max_rows=3) == 3
    assert store.sweep(max_rows=3) == 1
    assert [k for k, _ in rows(schema)] == [wire.storage_key("", plan, "k0")]


def test_refused_and_peeked_keys_leave_no_row(store: PostgresStore, schema: str) -> None:
    plan = Rule("norow", ["2/s"]).plan
    assert not store.decide(Op.decide(plan, "big", 5))  # more than the capacity
    assert store.decide(Op.peek(plan, "peeked", 1))
    assert store.decide(Op.decide(plan, "free", 0))
    assert rows(schema) == []


def test_a_refund_that_leaves_the_state_whole_deletes_the_row(store: PostgresStore, schema: str) -> None:
    plan = Rule("refund", ["2/s"], "sliding_window_log").plan
    store.decide(Op.decide(plan, "k", 2))
    store.refund(Op.refund(plan, "k", 1))
    assert store.decide(Op.peek(plan, "k", 1)).remaining == 0
    store.refund(Op.refund(plan, "k", 1))
    assert rows(schema) == []


def test_reset_deletes_the_keys_state(store: PostgresStore, schema: str) -> None:
    plan = Rule("reset", ["1/minute"]).plan
    store.decide(Op.decide(plan, "k", 1))
    assert not store.decide(Op.decide(plan, "k", 1))
    store.reset(plan, "k")
    assert store.decide(Op.decide(plan, "k", 1))


# -- round trips ------------------------------------------------------------------------


def test_try_acquire_many_is_one_statement_and_all_or_nothing(pg_url: str) -> None:
    per_user = Rule("user", ["1/minute"])
    per_ip = Rule("ip", ["5/minute"], "fixed_window")
    with Limiter(pg_url) as limiter:
        limiter.store.migrate()  # type: ignore[attr-defined]
        statements: list[str] = []
        execute = limiter.store.shell.execute  # type: ignore[attr-defined]

        def counting(sql: str, params: object, what: str, *rest: object) -> object:
            statements.append(sql)
            return execute(sql, params, what, *rest)

        limiter.store.shell.execute = counting  # type: ignore[attr-defined]
        assert limiter.try_acquire_many([(per_user, "u1"), (per_ip, "10.0.0.1")])
        refused = limiter.try_acquire_many([(per_ip, "10.0.0.1"), (per_user, "u1")])
        assert not refused
        assert [d.allowed for d in refused] == [True, False]
        assert len(statements) == 2
        assert limiter.peek(per_ip, "10.0.0.1", 0).remaining == 4  # the refused batch charged nothing


def test_concurrent_calls_coalesce_into_fewer_statements_with_serial_decisions(pg_url: str) -> None:
    rule = Rule("hot", ["50/minute"], "fixed_window")
    with Limiter(pg_url, max_in_flight=1) as limiter:
        limiter.try_acquire(rule, "warm-up", 0)
        statements = 0
        execute = limiter.store.shell.execute  # type: ignore[attr-defined]
        lock = threading.Lock()

        def counting(sql: str, params: object, what: str, *rest: object) -> object:
            nonlocal statements
            with lock:
                statements += 1
            return execute(sql, params, what, *rest)

        limiter.store.shell.execute = counting  # type: ignore[attr-defined]
        results: list[bool] = []

        def worker() -> None:
            for _ in range(10):
                d = limiter.try_acquire(rule, "hot-key")
                with lock:
                    results.append(d.allowed)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert sorted(results).count(True) == 50
    assert len(results) == 80
    assert statements < 80


def test_async_store_coalesces_and_admits_exactly_the_limit(pg_url: str) -> None:
    rule = Rule("hot-async", ["30/minute"], "gcra")

    async def main() -> list[bool]:
        async with AsyncLimiter(pg_url) as limiter:
            decisions = await asyncio.gather(*(limiter.try_acquire(rule, "k") for _ in range(60)))
            return [d.allowed for d in decisions]

    assert asyncio.run(main()).count(True) == 30


# -- errors -----------------------------------------------------------------------------


def test_a_statement_past_the_timeout_raises_store_timeout(schema: str) -> None:
    plan = Rule("slow", ["5/s"]).plan
    store = PostgresStore(PG_URL, schema=schema, timeout=0.3, batching=False)
    try:
        store.decide(Op.decide(plan, "k", 1))
        with psycopg.connect(PG_URL) as holder:
            holder.execute(f"SELECT 1 FROM {schema}.state FOR UPDATE")  # holds the row, transaction open
            started = time.monotonic()
            with pytest.raises(StoreTimeout) as info:
                store.decide(Op.decide(plan, "k", 1))
            assert time.monotonic() - started < 2.0
            # The server's statement_timeout cancels it (or, on a slow machine, the client's deadline).
            assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled | psycopg.OperationalError)
            holder.rollback()
        assert store.decide(Op.decide(plan, "k", 1))  # the connection is usable again
    finally:
        store.close()


def test_an_unreachable_server_raises_a_store_error_within_the_timeout() -> None:
    store = PostgresStore("postgresql://postgres@127.0.0.1:1/test", timeout=0.3)
    try:
        started = time.monotonic()
        with pytest.raises(StoreError) as info:
            store.decide(Op.decide(Rule("down", ["1/s"]).plan, "k", 1))
        assert time.monotonic() - started < 2.0
        assert info.value.__cause__ is not None
    finally:
        store.close()


def test_async_unreachable_server_raises_a_store_error_within_the_timeout() -> None:
    async def main() -> None:
        store = AsyncPostgresStore("postgresql://postgres@127.0.0.1:1/test", timeout=0.3)
        try:
            with pytest.raises(StoreError):
                await store.decide(Op.decide(Rule("down", ["1/s"]).plan, "k", 1))
        finally:
            await store.aclose()

    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < 3.0


def test_decisions_sweep_expired_rows_on_their_own(store: PostgresStore, schema: str) -> None:
    plan = Rule("self-sweep", ["1000000/s"], "fixed_window").plan
    for i in range(20):
        store.decide(Op.decide(plan, f"idle-{i}", 1))
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.state SET expires_at = 0")  # all idle and whole
    for _ in range(40):  # one call in 64 sweeps: 2000 calls all miss it with p < 1e-13
        for _ in range(50):
            store.decide(Op.decide(plan, "busy", 1))
        if len(rows(schema)) == 1:
            break
    assert [k for k, _ in rows(schema)] == [wire.storage_key("", plan, "busy")]


def test_a_row_written_at_a_given_now_expires_a_day_after_the_wall_clock(store: PostgresStore, schema: str) -> None:
    """Tests pass their own ``now``: their rows are kept by the wall clock (plus a day), so a
    sweep never deletes state that the test's time still counts."""
    store.decide(Op.decide(Rule("given-now", ["1/10s"]).plan, "k", 1), 1_000_000)
    ((_, expires_at),) = rows(schema)
    day = 86_400_000_000
    step = 10_000_000
    assert wall_us() + day + 10_000_000 - 5_000_000 <= expires_at <= wall_us() + day + 10_000_000 + 2_000_000 + step


def test_concurrent_batches_over_the_same_keys_in_every_order_never_deadlock(pg_url: str) -> None:
    """Each call locks its rows in one global order inside its statement: batches naming the
    same keys in opposite orders, single decisions and sweeps interleave without a deadlock."""
    import itertools
    import random

    rule = Rule("orders", ["1000000/s"], "fixed_window")
    keys = ["a", "b", "c", "d"]
    orders = list(itertools.permutations(keys))
    errors: list[BaseException] = []
    with Limiter(pg_url, max_size=8) as limiter:
        limiter.store.migrate()  # type: ignore[attr-defined]

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for _ in range(40):
                    if rng.random() < 0.8:
                        assert limiter.try_acquire_many([(rule, k) for k in rng.choice(orders)])
                    else:
                        assert limiter.try_acquire(rule, rng.choice(keys))
                        limiter.store.sweep(10)  # type: ignore[attr-defined]
            except BaseException as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert errors == []


def test_async_statement_past_the_timeout_raises_store_timeout(schema: str) -> None:
    plan = Rule("slow-async", ["5/s"]).plan

    async def main() -> None:
        store = AsyncPostgresStore(PG_URL, schema=schema, timeout=0.3)
        try:
            await store.decide(Op.decide(plan, "k", 1))
            with psycopg.connect(PG_URL) as holder:
                holder.execute(f"SELECT 1 FROM {schema}.state FOR UPDATE")  # holds the row
                started = time.monotonic()
                with pytest.raises(StoreTimeout):
                    await store.decide(Op.decide(plan, "k", 1))
                assert time.monotonic() - started < 2.0
                holder.rollback()
            assert await store.decide(Op.decide(plan, "k", 1))  # and the store works again
        finally:
            await store.aclose()

    asyncio.run(main())


# -- the fast path of a lone one-limit GCRA call ---------------------------------------


def test_a_lone_one_limit_gcra_call_runs_the_fast_function_other_lone_calls_the_single_op_one(
    store: PostgresStore,
) -> None:
    """GCRA's own fast function, ``<table>_decide_single`` for the other lone decides and
    peeks, ``<table>_decide`` for refunds (and calls of several ops)."""
    statements: list[str] = []
    execute = store.shell.execute

    def counting(sql: str, params: object, what: str, *rest: object) -> object:
        statements.append(sql.split("(", maxsplit=1)[0].rsplit("_", 1)[-1])
        return execute(sql, params, what, *rest)  # type: ignore[arg-type]

    store.shell.execute = counting  # type: ignore[method-assign]
    one = Rule("one", ["2/minute"]).plan
    two = Rule("two", ["2/minute", "10/hour"]).plan
    window = Rule("window", ["2/minute"], "fixed_window").plan
    assert store.decide(Op.decide(one, "k", 1)).allowed
    assert store.decide(Op.peek(one, "k", 1)).allowed  # a peek
    assert store.decide(Op.decide(one, "k", 1)).allowed
    assert store.decide(Op.decide(one, "k", 1, 60_000_000)).delay > 0  # a reservation
    assert not store.decide(Op.decide(one, "k", 1)).allowed
    store.refund(Op.refund(one, "k", 1))
    store.decide(Op.decide(two, "k", 1))
    store.decide(Op.decide(window, "k", 1))
    assert statements[-8:] == ["one"] * 5 + ["decide", "single", "single"]


def test_concurrent_first_calls_on_a_new_key_admit_exactly_the_limit(pg_url: str) -> None:
    """Fast calls that find no row race to insert it: the losers decide on the winner's row."""
    plan = Rule("new", ["2/minute"]).plan
    with PostgresStore(pg_url, batching=False, max_size=8) as store:
        store.decide(Op.decide(plan, "warm", 1))
        for key in ("a", "b", "c"):
            admitted: list[bool] = []
            barrier = threading.Barrier(8)

            def worker(key: str = key, admitted: list[bool] = admitted, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                admitted.append(store.decide(Op.decide(plan, key, 1)).allowed)

            threads = [threading.Thread(target=worker) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert sorted(admitted) == [False] * 6 + [True] * 2


def test_migrate_finds_a_connection_while_the_store_keeps_every_one(pg_url: str) -> None:
    """Decisions keep their connection between calls (no pool round trip); a migration
    still gets one from a pool of one."""
    plan = Rule("kept", ["5/s"]).plan
    with PostgresStore(pg_url, min_size=1, max_size=1, timeout=0.5) as store:
        assert store.decide(Op.decide(plan, "k", 1)).allowed
        started = time.monotonic()
        store.migrate()
        assert time.monotonic() - started < 5
        assert store.decide(Op.decide(plan, "k", 1)).allowed


# -- fork -------------------------------------------------------------------------------


def _decide_in_child(store: PostgresStore, plan: object, out: object) -> None:
    try:
        decision = store.decide(Op.decide(plan, "k", 1))  # type: ignore[arg-type]
        pid = store.shell.execute("SELECT pg_backend_pid()", (), "a check")[0]
        out.put((decision.allowed, pid))  # type: ignore[attr-defined]
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        out.put((None, repr(exc)))  # type: ignore[attr-defined]


def test_a_forked_child_opens_its_own_connections_and_leaves_the_parents_sessions_alone(pg_url: str) -> None:
    """A store used before a fork (a preloading web server): the child decides on sessions
    of its own, and the parent's session outlives the child's exit (its socket was never
    written by the child, not even libpq's Terminate on collection)."""
    import multiprocessing

    plan = Rule("forked", ["3/minute"]).plan
    with PostgresStore(pg_url, batching=False) as store:
        assert store.decide(Op.decide(plan, "k", 1)).allowed
        parent_pid = store.shell.execute("SELECT pg_backend_pid()", (), "a check")[0]
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_decide_in_child, args=(store, plan, out))
        child.start()
        allowed, child_pid = out.get(timeout=30)
        child.join(30)
        assert child.exitcode == 0
        assert allowed is True, child_pid
        assert child_pid != parent_pid
        assert store.decide(Op.decide(plan, "k", 1)).allowed  # the third of 3: the child's charge counted
        assert store.shell.execute("SELECT pg_backend_pid()", (), "a check")[0] == parent_pid
        assert not store.decide(Op.decide(plan, "k", 1)).allowed


def test_new_keys_of_the_gcra_fast_path_sweep_idle_rows(store: PostgresStore, schema: str) -> None:
    """A lone GCRA decision sweeps only when it creates a row (one in 8), so the sweeping
    keeps pace with the rows created while a busy key's decisions never sweep."""
    plan = Rule("fast-sweep", ["1000000/s"]).plan
    for i in range(20):
        store.decide(Op.decide(plan, f"idle-{i}", 1))
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.state SET expires_at = 0")  # all idle and whole
    idle = {wire.storage_key("", plan, f"idle-{i}") for i in range(20)}
    for i in range(400):  # one new row in 8 sweeps: 400 all miss it with p < 1e-23
        store.decide(Op.decide(plan, f"new-{i}", 1))
        if not idle & {k for k, _ in rows(schema)}:
            break
    assert not idle & {k for k, _ in rows(schema)}


def test_unlogged_on_an_existing_logged_table_says_it_was_not_applied(
    pg_url: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 9, item 9: ``unlogged=true`` applies when the store creates the table; on a
    logged table that exists already, the store and ``ratekeeper migrate`` say so."""
    from ratekeeper.cli import main

    logged = PostgresStore(pg_url)
    logged.migrate()
    logged.close()
    with caplog.at_level(logging.WARNING, logger="ratekeeper"):
        store = PostgresStore(f"{pg_url}&unlogged=true")
        try:
            assert store.decide(Op.decide(Rule("unlogged", ["1/s"]).plan, "k", 1)).allowed  # the schema check
        finally:
            store.close()
        assert 0 == main(["migrate", "--store", f"{pg_url}&unlogged=true"])
    notes = [r.getMessage() for r in caplog.records if "unlogged=true was not applied" in r.getMessage()]
    assert 2 == len(notes)
    assert f"ALTER TABLE {schema}.state SET UNLOGGED" in notes[0]
    with psycopg.connect(PG_URL) as conn:
        row = conn.execute("SELECT relpersistence FROM pg_class WHERE oid = to_regclass(%s)", (f"{schema}.state",))
        assert ("p",) == row.fetchone()  # left as it was
    caplog.clear()
    fresh = PostgresStore(f"{PG_URL}?schema={schema}_u&unlogged=true")
    try:
        with caplog.at_level(logging.WARNING, logger="ratekeeper"):
            fresh.migrate()
        assert not [r for r in caplog.records if "unlogged" in r.getMessage()]  # created UNLOGGED: nothing to say
    finally:
        fresh.close()
        drop_schema(f"{schema}_u")
