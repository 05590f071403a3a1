"""What the PostgreSQL store sends and how it reads the replies, without I/O.

``PostgresPlanner.plan`` writes the one statement that decides a list of ops in the wire
format (``stores/wire.py``), ``SELECT <schema>.<table>_decide(keys, request)`` or, for a
lone op, a function of its own; ``read`` turns the statement's first row into decisions.
The planner also holds the statements around them: the session settings, the warm-up,
the schema check and migration (``schema.py``), resets and sweeps. ``row`` and
``MAX_BATCH`` tell the coalescing (``stores/coalescing.py``) which row an op decides on
and how many ops one statement carries.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.op import CHARGE, Op
from ratekeeper.stores import wire
from ratekeeper.stores.coalescing import Coalescer
from ratekeeper.stores.postgres.options import PostgresOptions, statement_ms
from ratekeeper.stores.postgres.schema import ALGORITHM_FILES, marker, migration_sql

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision

__all__ = ["MAX_BATCH", "MAX_COST", "PostgresPlanner", "gcra_reply", "queue", "row"]

MAX_BATCH = 256
"""The most ops one coalesced statement carries."""
MAX_COST = 1 << 62
"""Costs above this are sent as this: every capacity is smaller, so the decision is the same."""
LOG_WARM_STATE = [1, 1, 0, 1, 2, *range(64), *range(2, 66)]
"""A sliding log's working state (``sql/sliding_window_log.sql``) whose write-back runs every
segment statement: a pulled-back segment to delete (flags 2, above hi = 1), dropped ones
(lo = 1 <= base = 1) and a head of 64 entries to seal."""
LOG_IN_SEGMENTS = [0, 100, 999, 1, 0]
"""A sliding log state whose newest segment (upto 100, last time 999) holds every entry."""


class PostgresPlanner:
    """The statements of one PostgreSQL store and how to read their replies."""

    def __init__(self, url: str, **options: Any) -> None:
        self.options = opts = PostgresOptions(url, **options)
        self.timeout = opts.timeout
        self.migrate_timeout = max(60.0, opts.timeout)
        self.decide_sql = f"SELECT {opts.schema}.{opts.table}_decide(%s::text[], %s::text)"
        self.decide_one_sql = f"SELECT {opts.schema}.{opts.table}_decide(ARRAY[%s::text], %s::text)"
        self.gcra_one_sql = f"SELECT {opts.schema}.{opts.table}_gcra_one(%s::text, %s::text)"
        self.decide_single_sql = f"SELECT {opts.schema}.{opts.table}_decide_single(%s::text, %s::text)"
        # The statements of one key, prepared by name on each connection: the shells run them
        # through libpq directly (text in and out), far cheaper on the client than a cursor.
        self.prepared: dict[str, tuple[bytes, bytes]] = {
            sql: (name, sql.replace("%s", "$1", 1).replace("%s", "$2", 1).encode())
            for name, sql in (
                (b"ratekeeper_gcra_one", self.gcra_one_sql),
                (b"ratekeeper_decide1", self.decide_one_sql),
                (b"ratekeeper_decide_single", self.decide_single_sql),
            )
        }
        self.reset_sql = f"SELECT {opts.schema}.{opts.table}_reset(%s)"
        self.sweep_sql = f"SELECT {opts.schema}.{opts.table}_sweep(%s)"
        self.installed_sql = (
            "SELECT obj_description(to_regprocedure(%s), 'pg_proc'), "
            "(SELECT relpersistence::text FROM pg_class WHERE oid = to_regclass(%s))"
        )
        self.installed_params = (f"{opts.schema}.{opts.table}_decide(text[],text)", f"{opts.schema}.{opts.table}")
        self.marker = marker()
        self.lock_sql = "SELECT pg_advisory_xact_lock(hashtext('ratekeeper.migrate'), hashtext(%s))"
        self.lock_params = (f"{opts.schema}.{opts.table}",)
        self.session_sql = (
            f"SELECT set_config('statement_timeout', '{opts.statement_timeout_ms}', false), "
            f"set_config('synchronous_commit', '{'on' if opts.synchronous_commit else 'off'}', false)"
        )

    @staticmethod
    def local_statement_timeout(seconds: float) -> str:
        """The statement that gives the rest of a transaction the server-side timeout of a call
        with ``seconds`` to finish (a little under it, as ``statement_timeout_ms``)."""
        return f"SET LOCAL statement_timeout = {statement_ms(seconds)}"

    def warm_up(self) -> tuple[str, tuple[Any, ...]]:
        """A statement that compiles every function and plans every statement inside them
        in a new session, for the shells to run in a transaction they roll back: a charge
        and a refund of every algorithm with one limit and a charge with two (each has a
        path of its own for one limit), a GCRA fast call and two charges of the single-op
        function (one creates its row, one updates it), on keys of this session only, a
        sweep of nothing, and the sliding log's segment statements: a write-back that
        deletes and seals (``LOG_WARM_STATE``), a denial and a refund whose window starts in
        a segment (none exists: the lookups find nothing). So no later call compiles PL/pgSQL
        or plans its writes (tens of milliseconds on a busy server) while it holds a row lock
        others wait for."""
        tag = secrets.token_hex(8)
        count = len(ALGORITHM_FILES)
        keys = [f"ratekeeper warm-up {tag} {name}" for name in ALGORITHM_FILES]
        keys += [f"ratekeeper warm-up {tag} {name} two" for name in ALGORITHM_FILES]
        fields: list[str] = ["", "0", str(3 * count)]
        for i, name in enumerate(ALGORITHM_FILES, 1):
            spec = ["1", "1", "1", "1"] if name in ("gcra", "token_bucket", "leaky_bucket") else ["1", "1"]
            fields += ["d", str(i), name, "1", *spec, "1", "", "w"]
            fields += ["r", str(i), name, "1", *spec, "1", "", "w"]
            # two limits: the algorithms' general paths (one limit takes a path of its own)
            fields += ["d", str(count + i), name, "2", *spec, *spec, "1", "", "w"]
        single = ",0,1,d,1,fixed_window,1,2,1000000000000,1,,"
        opts = self.options
        log = f"{opts.schema}.{opts.table}_sliding_window_log"
        return (
            f"SELECT {opts.schema}.{opts.table}_decide(%s::text[], %s::text), "
            f"{opts.schema}.{opts.table}_gcra_one(%s::text, %s::text), "
            f"{opts.schema}.{opts.table}_decide_single(%s::text, %s::text), "
            f"{opts.schema}.{opts.table}_decide_single(%s::text, %s::text), {opts.schema}.{opts.table}_sweep(0), "
            f"{opts.schema}.{opts.table}_log_flush(%s::text, %s::numeric[]), "
            f"{log}(%s::text, %s::numeric[], NULL, 1000, '{{1,10}}', 1, 'd'), "
            f"{log}(%s::text, %s::numeric[], NULL, 1000, '{{1,10}}', 50, 'r')",
            (
                keys,
                ",".join(fields),
                f"ratekeeper warm-up {tag}",
                ",d,1,1,1,1,1,",
                f"ratekeeper warm-up {tag} single",
                single,
                f"ratekeeper warm-up {tag} single",
                single,
                f"ratekeeper warm-up {tag} log",
                LOG_WARM_STATE,
                f"ratekeeper warm-up {tag} log",
                LOG_IN_SEGMENTS,
                f"ratekeeper warm-up {tag} log",
                LOG_IN_SEGMENTS,
            ),
        )

    def migration(self) -> str:
        opts = self.options
        return migration_sql(opts.schema, opts.table, opts.unlogged)

    def unlogged_not_applied(self, row: Any) -> str | None:
        """What to say when ``unlogged=true`` was asked of a table that exists as a logged
        one (``installed_sql``'s row): UNLOGGED applies only when the table is created, and
        turning an existing table UNLOGGED rewrites it under an exclusive lock, which a
        store should not do on its own. None when there is nothing to say."""
        opts = self.options
        if not opts.unlogged or row is None or len(row) < 2 or row[1] != "p":
            return None
        name = f"{opts.schema}.{opts.table}"
        return (
            f"unlogged=true was not applied: the table {name} already exists as a logged table, and "
            f"UNLOGGED applies only when the store creates it. To apply it, run "
            f"ALTER TABLE {name} SET UNLOGGED (it rewrites the table under an exclusive lock), "
            "or drop the table and let the store create it again"
        )

    def is_current(self, row: Any) -> bool:
        """Whether the installed functions (``installed_sql``'s row) are the ones shipped."""
        return row is not None and row[0] == self.marker

    def plan(self, ops: Sequence[wire.Op], now: int | None, atomic: bool = False) -> tuple[str, tuple[Any, ...]]:
        """The statement and parameters deciding ``ops`` in one round trip: a lone decide or
        peek takes ``<table>_gcra_one`` for a one-limit GCRA rule (the least arithmetic) and
        ``<table>_decide_single`` for any other rule (the same decision without the general
        function's loops and working copies); every other call (a refund, a charge without a
        check, several ops) takes ``<table>_decide``."""
        if len(ops) == 1 and ops[0][0] not in (wire.REFUND, CHARGE):
            op = ops[0]
            mode, plan, key, cost, max_wait, lease = op
            spec = _gcra_one(plan)
            if spec is not None:
                given = "" if now is None else now
                request = f"{given},{mode},{spec},{min(cost, MAX_COST)},{'' if max_wait is None else max_wait}"
                return self.gcra_one_sql, (wire.storage_key(self.options.prefix, plan, key), request)
            if cost > MAX_COST:
                op = Op((mode, plan, key, MAX_COST, max_wait, lease))
            keys, args = wire.encode_one(op, self.options.prefix, now)
            if atomic:
                args[1] = "1"
            if lease is not None and ("," in lease or "%" in lease):
                args[-1] = _escape_lease(lease)
            return self.decide_single_sql, (keys[0], ",".join(map(str, args)))
        if any(op[3] > MAX_COST for op in ops):
            ops = [Op((m, p, k, min(c, MAX_COST), w, lease)) for m, p, k, c, w, lease in ops]
        keys, args = wire.encode(ops, self.options.prefix, now, atomic)
        if any(op[5] for op in ops):  # lease ids are the only free text: keep their commas apart
            args = [_escape_lease(a) if isinstance(a, str) and ("," in a or "%" in a) else a for a in args]
        request = ",".join(map(str, args))
        if len(keys) == 1:
            return self.decide_one_sql, (keys[0], request)
        return self.decide_sql, (keys, request)

    @staticmethod
    def read(ops: Sequence[wire.Op], reply: Any) -> list[Decision | bool]:
        """The decisions from a statement's first row: the decide function's bigint[] (a list
        from a cursor, ``{1,-1,...}`` as text from a prepared statement), or the GCRA fast
        function's ``allowed,ahead`` (``gcra_reply``)."""
        value = reply[0] if reply is not None else None
        if value is None:
            return wire.decode(ops, ())
        if isinstance(value, bytes):
            value = value.decode()
        if isinstance(value, str):
            if value[:1] != "{":
                return wire.decode(ops, gcra_reply(ops[0], value))
            inner = value[1:-1]
            value = [int(x) for x in inner.split(",")] if inner else []
        return wire.decode(ops, value)

    def reset(self, plan: Plan, key: str) -> tuple[str, tuple[Any, ...]]:
        return self.reset_sql, (wire.storage_key(self.options.prefix, plan, key),)


def _gcra_one(plan: Plan) -> str | None:
    """``n,d,capacity,tau`` of a one-limit GCRA plan (kept on the plan), None for any other plan."""
    derived = plan.derived
    try:
        return derived["postgres.gcra_one"]  # type: ignore[no-any-return]
    except KeyError:
        spec = ",".join(map(str, plan.specs[0])) if plan.algorithm.name == "gcra" and len(plan.specs) == 1 else None
        derived["postgres.gcra_one"] = spec
        return spec


def gcra_reply(op: wire.Op, text: str) -> list[int]:
    """The wire reply of a one-limit GCRA op from ``<table>_gcra_one``'s ``allowed,ahead``
    (ahead = tat - now * d before the op): ``Gcra.decide``'s remaining steps, in Python."""
    allowed, ahead_text = text.split(",")
    n, d, cap, tau = op[1].specs[0]
    ahead = int(ahead_text)
    cost = min(op[3], MAX_COST)
    if cost > cap:
        return [0, 0, -1, 0, max(0, (tau - ahead) // n), -(-ahead // d)]
    over = ahead + cost * n - tau
    wait = -(-over // d) if over > 0 else 0
    if allowed == "1":
        return [1, -1, 0, wait, max(0, -over // n), -(-(over + tau) // d)]
    return [0, 0, wait, 0, max(0, (tau - ahead) // n), -(-ahead // d)]


def _escape_lease(lease: str) -> str:
    """A lease id that holds no comma (injective, so releases still match)."""
    return lease.replace("%", "%25").replace(",", "%2C")


def row(op: wire.Op) -> tuple[str, str]:
    """Which row an op decides on (its plan's table and its key). The coalescing sends at
    most one statement per row at a time: a second one would only wait for the first
    one's row lock on the server, so the ops for a busy row queue in the process instead
    and go together in the next statement."""
    return op[1].table, op[2]


def queue(options: PostgresOptions) -> Coalescer[wire.Op, Any]:
    """The queue of concurrent calls (``stores/coalescing.py``): at most ``max_in_flight``
    statements out, ``MAX_BATCH`` ops each, and one per row (``row``)."""
    return Coalescer(options.max_in_flight, MAX_BATCH, row, one_call_per_row=True)
