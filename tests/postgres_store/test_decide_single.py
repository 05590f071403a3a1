"""The lean single-op function (``<table>_decide_single``, ``sql/decide_single.sql``) decides
and stores exactly as the general one (``<table>_decide``).

Differential: random sequences of lone ops for every algorithm run in two schemas, one
through the single path (what ``PostgresPlanner.plan`` sends for a lone decide or peek) and
one through the general function with the very same request, in one statement; the
replies, the stored rows (state, leases) and a sliding log's segments must be equal after
every op, each decision equal to the reference's, and ``expires_at`` must follow the
general function's rule in both. Refunds take the general path on both sides. Plus the
race of two calls creating one row, and the store's own clock (the routing itself:
``test_planner.py``).
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from ratekeeper.limit import Limit
from ratekeeper.op import Op
from ratekeeper.rule import Rule
from ratekeeper.stores import wire
from ratekeeper.stores.postgres.planner import PostgresPlanner
from ratekeeper.stores.postgres.schema import migration_sql

from .conftest import PG_URL, drop_schema
from .traces import ALGORITHMS, BURSTY, Model, random_rule

pytestmark = pytest.mark.postgres

SECOND = 1_000_000
GRACE_US = SECOND  # decide.sql: GRACE_US, TEST_GRACE_US, EXPIRY_STEP_US
TEST_GRACE_US = 86_400 * SECOND
STEP_US = 10 * SECOND


@pytest.fixture
def schemas() -> Iterator[tuple[str, str]]:
    """Two freshly installed schemas: (single path, general path)."""
    names = (f"rk_single_{uuid.uuid4().hex[:10]}", f"rk_general_{uuid.uuid4().hex[:10]}")
    try:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            for name in names:
                conn.execute(migration_sql(name))
        yield names
    finally:
        for name in names:
            drop_schema(name)


def expires_rule(old: int | None, life: int, now_us: int, wall: int, given: bool) -> int:
    """``<table>_decide``'s expires_at of a written state (decide.sql, write-back)."""
    expires = wall + max(life, 0) + TEST_GRACE_US if given else now_us + max(life, 0) + GRACE_US
    old = 0 if old is None else old
    return old if expires <= old else (expires // SECOND + 1) * SECOND + STEP_US


def rows(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[Any, Any, int]]:
    return {
        key: (state, leases, expires)
        for key, state, leases, expires in conn.execute(f"SELECT key, state, leases, expires_at FROM {schema}.state")
    }


def log_segments(conn: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        f"SELECT key, upto, before, first_t, last_t, offs, rels FROM {schema}.state_log ORDER BY key, upto"
    ).fetchall()


def walls(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]) -> tuple[int, Any, Any, int]:
    """Run ``sql`` (two function calls) between two reads of the server's clock, in one
    statement: every clock read inside lies between them."""
    clock = "floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    row = conn.execute(f"SELECT {clock}, {sql}, {clock}", params).fetchone()
    assert row is not None
    return row[0], row[1], row[2], row[3]


def single_request(op: wire.Op, now: int | None, atomic: bool) -> str:
    """The request of a lone op as ``PostgresPlanner.plan`` writes it for ``<table>_decide_single``
    (for the one-limit GCRA ops that it sends to ``<table>_gcra_one``; no lease, no huge cost)."""
    args = wire.encode_one(op, "", now)[1]
    args[1] = "1" if atomic else "0"
    return ",".join(map(str, args))


def random_ops(rng: random.Random, algorithm: str, count: int) -> Iterator[tuple[int, bool, wire.Op]]:
    """``count`` lone ops (now, atomic, op) over three rules of ``algorithm`` and three keys:
    decides (reservations, leases), peeks, refunds, atomic calls, a clock that steps back."""
    plans = [random_rule(rng, algorithm, f"r{i}").plan for i in range(2)]
    plans.append(Rule("many", [Limit.from_us(150, 2_000_000), Limit.from_us(60, 300_000)], algorithm).plan)
    periods = [lim.period_us for p in plans for lim in p.limits]
    now = rng.choice((0, 5_000_000, 1_700_000_000_123_456))
    leases: list[tuple[Any, str, str]] = []
    for i in range(count):
        step = rng.random()
        if step < 0.3:
            pass
        elif step < 0.7:
            now += rng.randint(1, 5_000)
        elif step < 0.95:
            now += rng.randint(1, rng.choice(periods))
        elif step < 0.98:
            now += rng.randint(1, 3 * max(periods))
        else:
            now -= rng.randint(1, 100)  # the clock stepped back
        plan = rng.choice(plans)
        key = rng.choice(("a", "b", "c"))
        cost = rng.choice((0, 1, 1, 1, 2, 3, 12))
        kind = rng.random()
        if kind < 0.7:
            max_wait = rng.choice((None, 0, 10, 100_000, 2_000_000)) if algorithm in BURSTY else None
            lease = None
            if plan.leases:
                lease = rng.choice(("L", "L,", "L%")) + str(i)  # commas and % are escaped
                leases.append((plan, key, lease))
            yield now, rng.random() < 0.15, (wire.DECIDE, plan, key, cost, max_wait, lease)
        elif kind < 0.9:
            yield now, False, (wire.PEEK, plan, key, cost, None, None)
        elif plan.leases:
            p, k, lease = rng.choice(leases) if leases else (plan, key, "unknown")
            yield now, False, (wire.REFUND, p, k, 1, None, lease)
        else:
            yield now, False, (wire.REFUND, plan, key, rng.choice((1, 2, 5, 40)), None, None)


def long_log_ops(rng: random.Random, count: int) -> Iterator[tuple[int, bool, wire.Op]]:
    """``count`` lone ops on two keys of a sliding log that keeps hundreds of entries
    (sealed segments): charges a few ms apart, peeks, refunds, idle gaps."""
    plan = Rule("long", [Limit.from_us(400, 1_000_000), Limit.from_us(60, 50_000)], "sliding_window_log").plan
    now = 1_750_000_000_000_000
    for _ in range(count):
        step = rng.random()
        now += rng.randint(1, 4_000) if step < 0.9993 else rng.randint(100_000, 3_000_000)
        key = rng.choice(("a", "a", "b"))
        kind = rng.random()
        if kind < 0.9:
            yield now, rng.random() < 0.1, (wire.DECIDE, plan, key, rng.choice((0, 1, 1, 1, 2, 3)), None, None)
        elif kind < 0.98:
            yield now, False, (wire.PEEK, plan, key, 1, None, None)
        else:
            yield now, False, (wire.REFUND, plan, key, rng.choice((1, 2, 5, 40)), None, None)


def differential(schemas: tuple[str, str], ops: Iterator[tuple[int, bool, wire.Op]]) -> tuple[int, int]:
    """Run ``ops`` through both paths (see the module docstring), checking after every op;
    (rows the single path wrote, the most sliding-log segments held at once)."""
    single, general = schemas
    planner = PostgresPlanner(f"{PG_URL}?schema={single}")
    model = Model()
    written = sealed = 0
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for i, (now, atomic, op) in enumerate(ops):
            plan = op[1]
            before = {name: rows(conn, name) for name in schemas}
            sql, (skey, request) = planner.plan([op], now, atomic)
            label = f"op {i} at now={now} atomic={atomic}: {op}"
            if op[0] == wire.REFUND:
                assert sql == planner.decide_one_sql
                walls(
                    conn,
                    f"{single}.state_decide(ARRAY[%s], %s), {general}.state_decide(ARRAY[%s], %s)",
                    (skey, request, skey, request),
                )
                model.run(now, atomic, [op])  # the model's states follow the refund
            else:
                if plan.algorithm.name == "gcra" and len(plan.limits) == 1:
                    assert sql == planner.gcra_one_sql  # its own fast path: compare decide_single anyway
                    request = single_request(op, now, atomic)
                else:
                    assert sql == planner.decide_single_sql
                lo, got, want, hi = walls(
                    conn,
                    f"{single}.state_decide_single(%s, %s), {general}.state_decide(ARRAY[%s], %s)",
                    (skey, request, skey, request),
                )
                assert got == want, label
                assert wire.decode([op], got) == model.run(now, atomic, [op]), label
                life = max(got[4 + len(plan.limits) :])
                for name in schemas:
                    old, new = before[name].get(skey), rows(conn, name).get(skey)
                    if new is not None and (old is None or new[:2] != old[:2]):
                        written += name == single
                        expected = {expires_rule(old and old[2], life, now, w, True) for w in (lo, hi)}
                        assert new[2] in expected, f"{name}: {label}"
                    elif new is not None:
                        assert old is not None and new[2] == old[2], f"{name}: {label}"  # nothing written
            got_rows, want_rows = rows(conn, single), rows(conn, general)
            assert {k: r[:2] for k, r in got_rows.items()} == {k: r[:2] for k, r in want_rows.items()}, label
            if plan.algorithm.name == "sliding_window_log":
                segs = log_segments(conn, single)
                assert segs == log_segments(conn, general), label
                sealed = max(sealed, len(segs))
    return written, sealed


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("seed", [1, 2])
def test_single_path_decides_and_stores_as_the_general_path(
    schemas: tuple[str, str], algorithm: str, seed: int
) -> None:
    written, _ = differential(schemas, random_ops(random.Random(f"single-{algorithm}-{seed}"), algorithm, 400))
    assert written >= 50  # the single path did write rows


def test_single_path_keeps_a_long_sliding_log_as_the_general_path(schemas: tuple[str, str]) -> None:
    written, sealed = differential(schemas, long_log_ops(random.Random("single-long"), 1500))
    assert written >= 500
    assert sealed >= 4  # windows started inside sealed segments, and segments were sealed and dropped


@pytest.mark.parametrize("first_commits", [True, False])
def test_a_call_that_loses_the_race_to_create_a_row_decides_on_the_winners_row(
    schemas: tuple[str, str], first_commits: bool
) -> None:
    """Two charges of a new key at once: the second one's INSERT waits for the first call's
    transaction; when that commits, the second decides again on the row it created (the
    limit of 1 is used: refused); when it rolls back, the second creates the row."""
    single, _ = schemas
    planner = PostgresPlanner(f"{PG_URL}?schema={single}")
    plan = Rule("race", ["1/hour"], "fixed_window").plan
    now = 1_750_000_000_000_000
    sql, params = planner.plan([Op.decide(plan, "k", 1)], now)
    assert sql == planner.decide_single_sql
    replies: list[Any] = []
    with psycopg.connect(PG_URL) as first, psycopg.connect(PG_URL, autocommit=True) as second:
        assert first.execute(sql, params).fetchone() == ([1, -1, 0, 0, 0, 3_600_000_000 - now % 3_600_000_000],)
        pid = second.info.backend_pid
        thread = threading.Thread(target=lambda: replies.append(second.execute(sql, params).fetchone()))
        thread.start()
        with psycopg.connect(PG_URL, autocommit=True) as watch:
            while not watch.execute(  # the second call waits for the first one's row
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()[0]:
                assert thread.is_alive()
        first.commit() if first_commits else first.rollback()
        thread.join(10)
        assert not thread.is_alive()
        end = 3_600_000_000 - now % 3_600_000_000
        assert replies == [([0, 0, end, 0, 0, end],) if first_commits else ([1, -1, 0, 0, 0, end],)]
        assert second.execute(f"SELECT state FROM {single}.state").fetchall() == [([now // 3_600_000_000, 1],)]


def test_the_store_clock_decides_and_sets_expires_at_as_the_general_path(schemas: tuple[str, str]) -> None:
    """now = "" (the server's clock, read after the lock): a token bucket's row lives until
    its whole time plus a second, stepped as the general function steps it."""
    single, general = schemas
    planner = PostgresPlanner(f"{PG_URL}?schema={single}")
    plan = Rule("clock", ["10/s"], "token_bucket").plan
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for cost in (3, 1, 4):
            before = {name: rows(conn, name).get(wire.storage_key("", plan, "k")) for name in schemas}
            sql, (skey, request) = planner.plan([Op.decide(plan, "k", cost)], None)
            assert sql == planner.decide_single_sql
            lo, got, want, hi = walls(
                conn,
                f"{single}.state_decide_single(%s, %s), {general}.state_decide(ARRAY[%s], %s)",
                (skey, request, skey, request),
            )
            for name, reply in ((single, got), (general, want)):
                assert reply[0] == 1
                old = before[name]
                expected = {expires_rule(old and old[2], reply[5], w, w, False) for w in (lo, hi)}
                assert rows(conn, name)[skey][2] in expected
