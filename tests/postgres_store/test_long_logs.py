"""The PostgreSQL sliding log with long logs (its head and sealed segments, ``sql/sliding_window_log.sql``)
decides exactly as the reference, decision by decision and per limit.

Long random traces, seeded, on one or two limits: windows that start inside a segment,
logs crossing many segment boundaries, refunds that pull segments back into the head,
denials whose retry time lies in an old segment, a clock that steps back, atomic calls
that are refused, and everything expiring at once; plus what the segment table holds after
a reset, the sweep, a whole refund and a refused atomic call, and that an array in no
layout of the log fails its own call.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import psycopg
import pytest

from ratekeeper.errors import StoreError
from ratekeeper.limit import Limit
from ratekeeper.op import Op
from ratekeeper.rule import Rule
from ratekeeper.stores import wire
from ratekeeper.stores.postgres.schema import marker
from ratekeeper.stores.postgres.store import PostgresStore

from .conftest import PG_URL
from .traces import Model, check_async_store

pytestmark = pytest.mark.postgres

SEGMENT = 64
"""Entries per sealed segment (``SEGMENT`` in ``sql/sliding_window_log.sql``)."""
T0 = 1_750_000_000_000_000


def segments(schema: str, key: str | None = None) -> list[tuple[str, int, int, int, bool]]:
    """(key, upto, first_t, entries, unit costs) of every stored segment, oldest first."""
    where = "" if key is None else "WHERE key = %s"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        return conn.execute(
            f"SELECT key, upto, first_t, (octet_length(offs) - 1) / get_byte(offs, 0), rels IS NULL "
            f"FROM {schema}.state_log {where} "
            "ORDER BY key, upto",
            () if key is None else (key,),
        ).fetchall()


def state_rows(schema: str) -> list[tuple[str, Any]]:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        return conn.execute(f"SELECT key, state FROM {schema}.state ORDER BY key").fetchall()


RULES = {
    "one": [Limit.from_us(400, 2_000_000)],
    "two": [Limit.from_us(600, 4_000_000), Limit.from_us(60, 150_000)],
    "three": [Limit.from_us(150, 500_000), Limit.from_us(900, 8_000_000), Limit.from_us(12, 3_000)],
}


MIXED = (0, 1, 1, 1, 1, 2, 3)
UNIT = (0, 1, 1, 1, 1, 1, 1)
"""Costs of the charges: with costs of 1 only, segments store no running totals."""


def long_trace(
    rng: random.Random, plan: Any, calls: int, costs: tuple[int, ...] = MIXED
) -> list[tuple[int, bool, list[wire.Op]]]:
    """Calls on two keys of ``plan``: mostly charges a few ms apart (logs of hundreds of
    entries), peeks, refunds small and large, atomic pairs, clock steps back, idle gaps."""
    now = T0
    out: list[tuple[int, bool, list[wire.Op]]] = []
    for _ in range(calls):
        step = rng.random()
        if step < 0.3:
            pass
        elif step < 0.95:
            now += rng.randint(1, 1_000)
        elif step < 0.99:
            now += rng.randint(1_000, 50_000)
        elif step < 0.999:
            now -= rng.randint(1, 100)  # the clock stepped back
        else:
            now += rng.randint(2_000_000, 6_000_000)  # most or all of the log expires
        atomic = rng.random() < 0.1
        ops: list[wire.Op] = []
        for _ in range(2 if atomic else rng.choice((1, 1, 1, 2))):
            key = rng.choice(("a", "a", "b"))
            kind = rng.random()
            cost = rng.choice(costs)
            if atomic or kind < 0.85:
                ops.append((wire.DECIDE, plan, key, cost, None, None))
            elif kind < 0.95:
                ops.append((wire.PEEK, plan, key, cost, None, None))
            else:
                ops.append((wire.REFUND, plan, key, rng.choice((1, 1, 2, 5, 5, 40, 70)), None, None))
        out.append((now, atomic, ops))
    return out


@pytest.mark.parametrize(
    ("limits", "costs", "seed"),
    [(limits, MIXED, seed) for limits in sorted(RULES) for seed in (1, 2)]
    + [("one", UNIT, 1), ("two", UNIT, 1), ("three", UNIT, 2)],
)
def test_long_logs_decide_as_the_reference(
    store: PostgresStore, schema: str, limits: str, costs: tuple[int, ...], seed: int
) -> None:
    plan = Rule(f"long-{limits}", RULES[limits], "sliding_window_log").plan
    rng = random.Random(f"long-{limits}-{costs}-{seed}")
    model = Model()
    most = 0
    kinds: set[bool] = set()
    for i, (now, atomic, ops) in enumerate(long_trace(rng, plan, 2000, costs)):
        expected = model.run(now, atomic, ops)
        actual = store.decide_ops(ops, now=now, atomic=atomic)
        assert expected == actual, f"call {i} at now={now} atomic={atomic}: {ops}"
        if i % 20 == 0:
            held = segments(schema)
            most = max(most, len(held))
            kinds.update(unit for *_, unit in held)
    assert most >= 3  # the logs held several sealed segments: windows started inside them
    assert kinds == {costs is UNIT}  # segments without running totals only when every cost is 1


def test_async_long_log_decides_as_the_reference(pg_url: str, schema: str) -> None:
    plan = Rule("long-async", RULES["two"], "sliding_window_log").plan

    check_async_store(pg_url, long_trace(random.Random("long-async"), plan, 800))
    assert segments(schema)  # the log ended long enough to hold sealed segments


def fill(store: PostgresStore, plan: Any, key: str, entries: int, step: int = 1_000) -> int:
    """Admit ``entries`` calls of cost 1, ``step`` µs apart from T0; the time of the last one."""
    now = T0
    for i in range(entries):
        now = T0 + i * step
        assert store.decide(Op.decide(plan, key, 1), now=now)
    return now


def test_a_denial_whose_retry_lies_in_the_oldest_segment(store: PostgresStore, schema: str) -> None:
    entries = 3 * SEGMENT + 4
    plan = Rule("retry", [f"{entries}/10s"], "sliding_window_log").plan
    fill(store, plan, "k", entries)
    assert len(segments(schema)) == 3  # all sealed but the newest 4
    now = T0 + 5_000_000
    decision = store.decide(Op.decide(plan, "k", 5), now=now)
    # Five entries must expire: the fifth (admitted at T0 + 4 ms, in the first segment) frees them.
    assert (decision.allowed, decision.retry_after) == (False, (T0 + 4_000 + 10_000_000 - now) / 1e6)
    model = Model()
    for i in range(entries):
        model.run(T0 + i * 1_000, False, [(wire.DECIDE, plan, "k", 1, None, None)])
    assert model.run(now, False, [(wire.DECIDE, plan, "k", 5, None, None)]) == [decision]


def test_a_window_starting_inside_a_segment_counts_from_there(store: PostgresStore, schema: str) -> None:
    plan = Rule("window", ["1000/10s", "50/50ms"], "sliding_window_log").plan
    last = fill(store, plan, "k", 200, step=2_000)  # the short window holds 25 entries, from inside a segment
    decision = store.decide(Op.peek(plan, "k", 0), now=last + 1)
    assert [s.remaining for s in decision.limits] == [1000 - 200, 50 - 25]


def test_a_refund_pulls_the_newest_segment_back_into_the_head(store: PostgresStore, schema: str) -> None:
    plan = Rule("pull", ["1000/1h"], "sliding_window_log").plan
    last = fill(store, plan, "k", 2 * SEGMENT + 6)
    key = wire.storage_key("", plan, "k")
    assert [s[1] for s in segments(schema, key)] == [SEGMENT, 2 * SEGMENT]
    store.refund(Op.refund(plan, "k", 20), now=last)  # the cut lies in the second segment
    assert [s[1] for s in segments(schema, key)] == [SEGMENT]
    decision = store.decide(Op.decide(plan, "k", 1), now=last + 1)
    assert decision.remaining == 1000 - (2 * SEGMENT + 6 - 20) - 1
    store.refund(Op.refund(plan, "k", 10**6), now=last + 2)  # everything back: whole
    assert state_rows(schema) == []
    assert segments(schema) == []


def test_reset_deletes_the_logs_segments(store: PostgresStore, schema: str) -> None:
    plan = Rule("reset", ["500/1h"], "sliding_window_log").plan
    fill(store, plan, "k", 3 * SEGMENT)
    fill(store, plan, "other", SEGMENT + 1)
    store.reset(plan, "k")
    assert [s[0] for s in segments(schema)] == [wire.storage_key("", plan, "other")]
    assert store.decide(Op.peek(plan, "k", 1), now=T0).remaining == 499


def test_the_sweep_deletes_the_segments_of_the_rows_it_deletes(store: PostgresStore, schema: str) -> None:
    plan = Rule("sweep", ["500/1h"], "sliding_window_log").plan
    fill(store, plan, "old", 2 * SEGMENT)
    fill(store, plan, "live", 2 * SEGMENT)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.state SET expires_at = 0 WHERE key = %s", (wire.storage_key("", plan, "old"),))
    assert store.sweep() == 1
    assert {s[0] for s in segments(schema)} == {wire.storage_key("", plan, "live")}


def test_segments_whose_entries_expired_are_deleted_as_the_window_passes(store: PostgresStore, schema: str) -> None:
    window = 3 * SEGMENT * 1_000  # 3 segments of entries 1 ms apart
    plan = Rule("expire", [Limit.from_us(10_000, window)], "sliding_window_log").plan
    last = fill(store, plan, "k", 10 * SEGMENT, step=1_000)
    kept = segments(schema)
    assert 2 <= len(kept) <= 3  # the window's entries, not all ten segments' worth
    assert kept[0][2] > last - window - SEGMENT * 1_000


def test_a_refused_atomic_call_writes_no_segment(store: PostgresStore, schema: str) -> None:
    log = Rule("atomic-log", ["500/1h"], "sliding_window_log").plan
    tight = Rule("atomic-tight", ["1/1h"], "fixed_window").plan
    last = fill(store, log, "k", SEGMENT - 1)  # the next charge fills the head: it would seal a segment
    assert store.decide(Op.decide(tight, "k", 1), now=last)
    before = (segments(schema), state_rows(schema))
    decisions = store.decide_ops(
        [(wire.DECIDE, log, "k", 1, None, None), (wire.DECIDE, tight, "k", 1, None, None)], now=last + 1, atomic=True
    )
    assert [d.allowed for d in decisions if d is not None] == [True, False]
    assert (segments(schema), state_rows(schema)) == before
    assert store.decide(Op.decide(log, "k", 1), now=last + 2)
    assert len(segments(schema)) == 1


@pytest.mark.parametrize(
    "state",
    [[1_750_000_000_000_000, 1, 1_750_000_000_000_100, 2], [0, 0, 0], [0]],
    ids=["time-cost-pairs", "three", "one"],
)
def test_an_array_in_no_layout_of_the_log_fails_its_own_call(
    store: PostgresStore, schema: str, state: list[int]
) -> None:
    """(time, cost) pairs (a layout no release wrote) or an array too short for the header
    are no state of the rule: its calls fail, every write path alike, rather than misread
    it, and leave the row and the other keys as they were."""
    plan = Rule("bad", ["1000/1h", "30/10ms"], "sliding_window_log").plan
    key = wire.storage_key("", plan, "bad")
    assert store.decide(Op.decide(plan, "good", 1), now=T0)  # installs the schema
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {schema}.state (key, state, expires_at) VALUES (%s, %s::numeric[], %s)",
            (key, state, 2**62),
        )
    before = state_rows(schema)
    calls = [
        [Op.decide(plan, "bad", 1)],  # a lone decide: decide_single
        [Op.peek(plan, "bad", 1), Op.decide(plan, "good", 1)],  # the general function
        [Op.refund(plan, "bad", 1)],
        [Op.charge(plan, "bad", 1)],
    ]
    for ops in calls:
        with pytest.raises(StoreError, match="not a sliding log state"):
            store.decide_ops(ops, now=T0 + 1_000)
    assert state_rows(schema) == before
    assert segments(schema) == []
    assert store.decide(Op.decide(plan, "good", 1), now=T0 + 2_000).remaining == 30 - 2


def test_threads_on_one_long_log_admit_exactly_the_limit(pg_url: str, schema: str) -> None:
    plan = Rule("hammer", ["300/1h"], "sliding_window_log").plan
    admitted: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        store = PostgresStore(pg_url, max_size=1)
        try:
            mine = sum(bool(store.decide(Op.decide(plan, "hot", 1))) for _ in range(60))
        finally:
            store.close()
        with lock:
            admitted.append(mine)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 300
    assert len(segments(schema)) == 300 // SEGMENT


@pytest.mark.parametrize(
    ("limits", "costs", "gaps", "base"),
    [
        # Costs past int4: segments are cut early (a running total relative to the first entry must fit).
        ([Limit.from_us(2**40, 60_000_000)], (1, 2**31 - 1, 2**31, 2**33, 5), (1, 1_000, 50_000), 0),
        # Running totals past bigint (a log that has admitted 2**64 already): numeric throughout.
        ([Limit.from_us(2**50, 60_000_000), Limit.from_us(2**45 + 3, 1_000_000)], (1, 7, 2**44), (1, 70_000), 2**64),
        # Gaps past int4 µs (35 minutes) inside a two-day window: segments cut early on time.
        (
            [Limit.from_us(500, 2 * 86_400_000_000)],
            (1, 1, 2),
            (1,) * 6 + (1_000,) * 6 + (2**31 - 1, 2**31, 3 * 10**9),
            0,
        ),
    ],
    ids=["costs-past-int4", "totals-past-bigint", "gaps-past-int4"],
)
def test_long_logs_with_large_numbers_decide_as_the_reference(
    store: PostgresStore, schema: str, limits: list[Limit], costs: tuple[int, ...], gaps: tuple[int, ...], base: int
) -> None:
    plan = Rule("large", limits, "sliding_window_log").plan
    rng = random.Random(f"large-{limits}")
    model = Model()
    if base:  # the same log, emptied after admitting ``base``, in the store and in the reference
        store.decide(Op.peek(plan, "warm", 1), now=T0)  # installs the schema
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO {schema}.state (key, state, expires_at) VALUES (%s, %s::numeric[], %s)",
                (wire.storage_key("", plan, "k"), [base, 0, 0, 0, 0], 2**62),
            )
        model.states[wire.storage_key("", plan, "k")] = (base, [], [], 0, 0)
    now = T0
    for i in range(600):
        now += rng.choice(gaps)
        kind = rng.random()
        if kind < 0.85:
            op: wire.Op = (wire.DECIDE, plan, "k", rng.choice(costs), None, None)
        elif kind < 0.95:
            op = (wire.PEEK, plan, "k", rng.choice(costs), None, None)
        else:
            op = (wire.REFUND, plan, "k", rng.choice(costs), None, None)
        assert model.run(now, False, [op]) == store.decide_ops([op], now=now), f"call {i} at now={now}: {op}"
    held = segments(schema)
    assert len(held) >= 3
    if base:
        assert min(upto for _, upto, *_ in held) > 2**64
    else:
        assert min(entries for _, _, _, entries, _ in held) < SEGMENT  # some were cut early


@pytest.mark.parametrize(("first", "later"), [(True, True), (False, True), (True, False)])
def test_the_segment_table_has_the_state_tables_persistence(schema: str, first: bool, later: bool) -> None:
    """UNLOGGED or not as the state table (a crash empties both or neither), also when a
    later migration creates the segment table next to a state table that already exists
    (the segment table dropped by hand), whatever unlogged= says then."""
    for step, unlogged in enumerate((first, later)):
        store = PostgresStore(PG_URL, schema=schema, unlogged=unlogged)
        try:
            store.migrate()
        finally:
            store.close()
        if step == 0:  # the segment table gone, and functions of another version: the next store migrates
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f"DROP TABLE {schema}.state_log")
                conn.execute(f"COMMENT ON FUNCTION {schema}.state_decide(text[], text) IS 'ratekeeper older'")
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        found = conn.execute(
            "SELECT relname, relpersistence FROM pg_class WHERE oid IN (%s::regclass, %s::regclass) ORDER BY relname",
            (f"{schema}.state", f"{schema}.state_log"),
        ).fetchall()
    assert found == [("state", "u" if first else "p"), ("state_log", "u" if first else "p")]


def test_an_install_of_another_version_gets_the_shipped_sliding_log_at_a_stores_first_call(
    pg_url: str, schema: str
) -> None:
    """A changed function body reaches an existing database as every function change does:
    the store trusts an install that carries its marker, and migrates one that carries
    another at its first call, which then runs the body this package ships."""
    plan = Rule("upgrade", ["5/1h"], "sliding_window_log").plan
    first = PostgresStore(pg_url)
    try:
        first.migrate()
    finally:
        first.close()
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(
            f"CREATE OR REPLACE FUNCTION {schema}.state_sliding_window_log("
            "lkey text, st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, op_mode text, "
            "OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[]) "
            "LANGUAGE plpgsql STABLE AS $$ BEGIN RAISE EXCEPTION 'an older body'; END $$"
        )
    for marked, works in (("current", False), ("older", True)):
        if marked == "older":
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f"COMMENT ON FUNCTION {schema}.state_decide(text[], text) IS 'ratekeeper older'")
        store = PostgresStore(pg_url)
        try:
            if works:
                assert store.decide(Op.decide(plan, "k", 1), now=T0).remaining == 4
            else:
                with pytest.raises(StoreError, match="an older body"):
                    store.decide(Op.decide(plan, "k", 1), now=T0)
        finally:
            store.close()
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        installed = conn.execute(
            "SELECT obj_description(to_regprocedure(%s), 'pg_proc')", (f"{schema}.state_decide(text[],text)",)
        ).fetchone()
    assert installed == (marker(),)
