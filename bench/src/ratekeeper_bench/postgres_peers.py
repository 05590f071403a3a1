"""The strategies ``ratekeeper bench postgres`` measures ratekeeper's PostgreSQL store against.

Every subject admits at most one call per ``interval`` for a key (a limit of 1 per 10 ms
by default: GCRA with a burst of 1, the spacing that an exclusion constraint expresses
naturally), so all of them should admit the same calls, and each builds a
``SyncRunner`` whose ``decide(key)`` is safe to call from many threads at once.

The three strategies that teams write first exist only here, in this benchmark:

- ``for_update``: ``SELECT next_at <= clock_timestamp() ... FOR UPDATE NOWAIT``, then an
  ``UPDATE`` (or an ``INSERT ... ON CONFLICT DO NOTHING`` for a new key) in one
  transaction: BEGIN, two statements, COMMIT. A lock held by another caller raises
  ``LockNotAvailable``, which is a denial, as is losing the race to insert a new key.
- ``exclusion``: ``INSERT`` a ``tstzrange(now, now + interval)`` into a table with
  ``EXCLUDE USING gist (key WITH =, during WITH &&)`` (btree_gist); the
  ``ExclusionViolation`` of an overlapping range is the denial. One row per admission;
  nothing removes old rows during a cell.
- ``upsert``: ``INSERT ... ON CONFLICT (key) DO UPDATE SET next_at = ... WHERE next_at <=
  clock_timestamp() RETURNING 1``: a row back means admitted. One statement.

And two libraries:

- ratekeeper: ``Limiter(url, schema=..., min_size=workers, max_size=workers)`` with
  ``Rule(..., ["1/10ms"], algorithm="gcra")``; coalescing as shipped (on).
- pyrate-limiter: its ``PostgresBucket`` (``LOCK TABLE ... IN EXCLUSIVE MODE NOWAIT``, a
  count, an insert; a lock conflict is a denial) with ``Rate(1, 10)`` (ms) behind
  ``Limiter(bucket).try_acquire(key, 1, False)``, one ``Limiter`` and bucket per thread
  over the one table (as many processes would have: a ``Limiter`` shared by threads
  answers False, without asking the database, to a non-blocking call that finds its
  in-process lock taken). One bucket is one table, and every call goes to it whatever
  its key, so it is measured on the hot key only.

Every connection has ``search_path`` set to the run's schema (then ``public``), so every
table lives in that schema and goes when the run drops it, and the same
``synchronous_commit`` (off by default, ratekeeper's own default), so the subjects differ
in their statements only, not in how durable a commit is; every pool holds ``workers``
connections, ratekeeper's included.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ratekeeper_bench.latency import SyncRunner, Target

__all__ = ["SUBJECTS", "Load", "PgSubject", "connect_kwargs", "limit_text", "pool", "subject"]


@dataclass(frozen=True, slots=True)
class Load:
    """The same for every subject: one call per ``interval`` seconds per key, ``workers``
    threads and connections, and whether each commit waits for its WAL flush."""

    interval: float
    workers: int
    synchronous_commit: bool = False


@dataclass(frozen=True, slots=True)
class PgSubject:
    """One way to decide; ``hot_key_only`` when it cannot hold one limit per key."""

    name: str
    build: Callable[[Target, Load], SyncRunner]
    how: str
    hot_key_only: bool = False


def connect_kwargs(schema: str, load: Load, *, autocommit: bool = True) -> dict[str, Any]:
    """Connection options for every pool of the run: its schema first on the search path,
    and ``synchronous_commit`` as the load says (ratekeeper's store sets it per session too)."""
    commit = "on" if load.synchronous_commit else "off"
    return {"autocommit": autocommit, "options": f"-c search_path={schema},public -c synchronous_commit={commit}"}


def pool(target: Target, load: Load, *, autocommit: bool = True) -> Any:
    """A psycopg pool of exactly ``load.workers`` connections, open and filled."""
    from psycopg_pool import ConnectionPool

    opened = ConnectionPool(
        target.url,
        min_size=load.workers,
        max_size=load.workers,
        kwargs=connect_kwargs(target.prefix, load, autocommit=autocommit),
        open=True,
    )
    opened.wait(timeout=30)
    return opened


# -- (i) SELECT ... FOR UPDATE NOWAIT, then UPDATE or INSERT ------------------------------------


def _for_update(target: Target, load: Load) -> SyncRunner:
    from psycopg import errors

    conns = pool(target, load)
    step = timedelta(seconds=load.interval)
    with conns.connection() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS fu_limits (key text PRIMARY KEY, next_at timestamptz NOT NULL)")

    def decide(key: str) -> bool:
        with conns.connection() as conn:
            try:
                with conn.transaction():
                    row = conn.execute(
                        "SELECT next_at <= clock_timestamp() FROM fu_limits WHERE key = %s FOR UPDATE NOWAIT", (key,)
                    ).fetchone()
                    if row is None:
                        cur = conn.execute(
                            "INSERT INTO fu_limits VALUES (%s, clock_timestamp() + %s) ON CONFLICT DO NOTHING",
                            (key, step),
                        )
                        return bool(cur.rowcount == 1)
                    if not row[0]:
                        return False
                    conn.execute("UPDATE fu_limits SET next_at = clock_timestamp() + %s WHERE key = %s", (step, key))
                    return True
            except errors.LockNotAvailable:
                return False

    return SyncRunner(decide, conns.close)


# -- (ii) an exclusion constraint on a tstzrange ------------------------------------------------


def _exclusion(target: Target, load: Load) -> SyncRunner:
    from psycopg import errors

    conns = pool(target, load)
    step = timedelta(seconds=load.interval)
    with conns.connection() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS ex_limits (key text NOT NULL, during tstzrange NOT NULL, "
            "EXCLUDE USING gist (key WITH =, during WITH &&))"
        )

    def decide(key: str) -> bool:
        with conns.connection() as conn:
            try:
                conn.execute(
                    "INSERT INTO ex_limits SELECT %s, tstzrange(t, t + %s) FROM (SELECT clock_timestamp() AS t) AS n",
                    (key, step),
                )
            except errors.ExclusionViolation:
                return False
            return True

    return SyncRunner(decide, conns.close)


# -- (iii) INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING -------------------------------


def _upsert(target: Target, load: Load) -> SyncRunner:
    conns = pool(target, load)
    step = timedelta(seconds=load.interval)
    with conns.connection() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS up_limits (key text PRIMARY KEY, next_at timestamptz NOT NULL)")
    query = (
        "INSERT INTO up_limits AS l VALUES (%(key)s, clock_timestamp() + %(step)s) ON CONFLICT (key) DO UPDATE "
        "SET next_at = clock_timestamp() + %(step)s WHERE l.next_at <= clock_timestamp() RETURNING 1"
    )

    def decide(key: str) -> bool:
        with conns.connection() as conn:
            return conn.execute(query, {"key": key, "step": step}).fetchone() is not None

    return SyncRunner(decide, conns.close)


# -- ratekeeper ---------------------------------------------------------------------------------


def limit_text(interval: float) -> str:
    """The ratekeeper limit for one call per ``interval`` seconds: ``1/10ms``."""
    ms = interval * 1000
    return f"1/{ms:g}ms" if ms == int(ms) else f"1/{interval:g}s"


def _ratekeeper(target: Target, load: Load) -> SyncRunner:
    from ratekeeper import Limiter, Rule

    limiter = Limiter(
        target.url,
        schema=target.prefix,
        min_size=load.workers,
        max_size=load.workers,
        synchronous_commit=load.synchronous_commit,
    )
    rule = Rule("bench", [limit_text(load.interval)], algorithm="gcra")
    acquire = limiter.try_acquire

    def decide(key: str) -> bool:
        return acquire(rule, key).allowed

    return SyncRunner(decide, limiter.close)


# -- pyrate-limiter -----------------------------------------------------------------------------


def _pyrate(target: Target, load: Load) -> SyncRunner:
    from pyrate_limiter import Limiter, PostgresBucket, Rate

    conns = pool(target, load, autocommit=False)  # LOCK TABLE needs a transaction
    rates = [Rate(1, round(load.interval * 1000))]
    local = threading.local()
    limiters: list[Any] = []
    lock = threading.Lock()

    def limiter() -> Any:
        # One Limiter per thread, as separate processes would have: a shared Limiter
        # answers False at once to any non-blocking call that finds its in-process lock taken.
        found = getattr(local, "limiter", None)
        if found is None:
            found = local.limiter = Limiter(PostgresBucket(conns, "bench", rates))
            with lock:
                limiters.append(found)
        return found

    def decide(key: str) -> bool:
        return bool(limiter().try_acquire(key, 1, False))

    def close() -> None:
        for each in limiters:
            each.close()
        conns.close()

    return SyncRunner(decide, close)


SUBJECTS: tuple[PgSubject, ...] = (
    PgSubject(
        "ratekeeper",
        _ratekeeper,
        '`Limiter(url, schema=..., min_size=16, max_size=16).try_acquire(Rule("bench", ["1/10ms"], algorithm="gcra"), '
        "key)`",
    ),
    PgSubject(
        "for_update",
        _for_update,
        "BEGIN; `SELECT next_at <= clock_timestamp() … FOR UPDATE NOWAIT`; `UPDATE` (or `INSERT … ON CONFLICT DO "
        "NOTHING` for a new key); COMMIT. `LockNotAvailable` = denied",
    ),
    PgSubject(
        "exclusion",
        _exclusion,
        "`INSERT` of `tstzrange(now, now + 10 ms)` into a table with `EXCLUDE USING gist (key WITH =, during WITH &&)`;"
        " `ExclusionViolation` = denied",
    ),
    PgSubject(
        "upsert",
        _upsert,
        "`INSERT … ON CONFLICT (key) DO UPDATE SET next_at = now + 10 ms WHERE next_at <= now RETURNING 1`; a row = "
        "admitted",
    ),
    PgSubject(
        "pyrate-limiter",
        _pyrate,
        "`Limiter(PostgresBucket(pool, ..., [Rate(1, 10)])).try_acquire(key, 1, False)`, one per thread: LOCK "
        "TABLE NOWAIT, count, insert (one table per bucket: hot key only)",
        hot_key_only=True,
    ),
)


def subject(name: str) -> PgSubject:
    for found in SUBJECTS:
        if found.name == name:
            return found
    raise ValueError(f"unknown subject {name!r}; choose from: {', '.join(s.name for s in SUBJECTS)}")
