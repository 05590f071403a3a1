"""The PostgreSQL store without I/O: options, the SQL it installs, what one call sends, how
to read the reply, and how errors are named.

The sync (``postgres.py``) and asyncio (``postgres_async.py``) shells only execute what
this module plans, so the logic exists once:

- ``PostgresOptions``: the URL and its options (``schema``, ``table``, ``unlogged``,
  ``timeout``, ``min_size``, ``max_size``, ``prefix``), checked.
- ``migration_sql``: the schema, the state table and the PL/pgSQL functions
  (``sql/*.sql``, shipped as package data), idempotent.
- ``PostgresCore.call``: one statement, ``SELECT <schema>.<table>_decide(keys, args)``,
  deciding a list of ops in the wire format (``wire.py``); ``decode`` reads its reply.
- ``row``, ``MAX_BATCH`` and ``store_down``: what the coalescing of concurrent calls
  (``stores/coalescing.py``) needs to know: which row an op decides on (one statement per
  row at a time), how many ops one statement carries, and whether a failed statement says
  the server is unreachable or timed out.
- ``translate``: psycopg / psycopg_pool exceptions become ``StoreTimeout`` / ``StoreError``;
  ``sever`` ends a statement the server does not answer (the shells' client-side deadline).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import secrets
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.errors import ConfigurationError, StoreError, StoreTimeout
from ratekeeper.op import Op
from ratekeeper.stores import wire
from ratekeeper.stores.options import bool_option, number_option, prefix_option

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision

__all__ = [
    "ALGORITHM_FILES",
    "FIRST_CONNECT_SLICE",
    "MAX_BATCH",
    "POSTGRES_SCHEMES",
    "Connects",
    "PostgresCore",
    "PostgresOptions",
    "migration_sql",
    "refusal",
    "row",
    "store_down",
    "translate",
]

POSTGRES_SCHEMES = ("postgresql", "postgres")
ALGORITHM_FILES = tuple(ALGORITHMS)
"""One script (SQL file) per algorithm of the registry, named after it, in its order."""
OPTIONS = (
    "schema",
    "table",
    "unlogged",
    "timeout",
    "min_size",
    "max_size",
    "prefix",
    "batching",
    "max_in_flight",
    "synchronous_commit",
)
LIBPQ_OPTIONS = (
    "application_name",
    "sslmode",
    "sslcert",
    "sslkey",
    "sslrootcert",
    "sslpassword",
    "passfile",
    "target_session_attrs",
    "options",
    "user",
    "password",
    "host",
    "port",
    "dbname",
)
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,47}")
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


def _identifier(name: str, value: Any) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise ConfigurationError(
            f"store option {name} must be a plain lower-case SQL identifier (letters, digits, _; "
            f"at most 48 characters, not starting with a digit), got {value!r}"
        )
    return value


class PostgresOptions:
    """A ``postgresql://`` URL with its options; keywords override the URL's query.

    ``schema`` (default ``ratekeeper``) and ``table`` (default ``state``) name where the
    state lives; ``unlogged`` creates the table UNLOGGED (faster, emptied by a crash);
    ``timeout`` (seconds, default 1.0) bounds connecting, waiting for a pooled connection
    and each statement (``statement_timeout``); ``min_size`` / ``max_size`` size the pool;
    ``prefix`` is put before every storage key; ``batching`` (default true) coalesces
    concurrent calls into one statement while ``max_in_flight`` statements are out
    (default ``max_size``: a caller queues only while every connection is busy or its row
    has a statement out);
    ``synchronous_commit`` (default false) makes each decision wait for its WAL flush
    (off, a crash of the server may forget the last few milliseconds of charges, never
    corrupt a state; each decision is about a millisecond faster on a disk that syncs).
    libpq's own query parameters (``sslmode``, ``application_name``, ...) pass through.
    """

    def __init__(self, url: str, **options: Any) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in POSTGRES_SCHEMES:
            raise ConfigurationError(f"not a PostgreSQL URL: {url!r}; expected postgresql://user@host:port/dbname")
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        ours = {k: v for k, v in query.items() if k in OPTIONS}
        libpq = {k: v for k, v in query.items() if k not in OPTIONS}
        unknown = (set(libpq) - set(LIBPQ_OPTIONS)) | (set(options) - set(OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"unknown option(s) {sorted(unknown)} for postgresql://; accepted: {', '.join(OPTIONS)} "
                f"(in the URL or as keywords) and libpq's {', '.join(LIBPQ_OPTIONS)} (in the URL)"
            )
        ours.update(options)
        self.schema: str = _identifier("schema", ours.get("schema", "ratekeeper"))
        self.table: str = _identifier("table", ours.get("table", "state"))
        self.unlogged: bool = bool_option("unlogged", ours.get("unlogged", False))
        self.timeout: float = number_option("timeout", ours.get("timeout", 1.0), float, 0.001)
        self.min_size: int = number_option("min_size", ours.get("min_size", 1), int, 0)
        self.max_size: int = number_option("max_size", ours.get("max_size", 10), int, 1)
        if self.max_size < self.min_size:
            raise ConfigurationError(f"store option max_size ({self.max_size}) must be >= min_size ({self.min_size})")
        self.prefix: str = prefix_option(ours.get("prefix", ""))
        self.batching: bool = bool_option("batching", ours.get("batching", True))
        # Default: one statement per pooled connection, so a caller with a connection free
        # (and its row idle) never waits for another's statement.
        self.max_in_flight: int = number_option("max_in_flight", ours.get("max_in_flight", self.max_size), int, 1)
        self.synchronous_commit: bool = bool_option("synchronous_commit", ours.get("synchronous_commit", False))
        self.conninfo: str = urlunsplit(parts._replace(query=urlencode(libpq)))

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of every pooled connection (libpq rounds a connect timeout up to 2 s)."""
        return {
            "autocommit": True,
            "connect_timeout": max(1, round(self.timeout + 0.499)),
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 3,
            "prepare_threshold": 0,
        }

    @property
    def statement_timeout_ms(self) -> int:
        """The server's ``statement_timeout``: a little under ``timeout``, so the server
        cancels a slow statement (and keeps the connection) before the client-side deadline
        severs it."""
        return statement_ms(self.timeout)


def statement_ms(seconds: float) -> int:
    """A server-side statement timeout for a call with ``seconds`` to finish, in ms."""
    return max(1, round(seconds * 800))


def _sql_file(name: str) -> str:
    return resources.files("ratekeeper.stores.postgres").joinpath("sql", f"{name}.sql").read_text(encoding="utf-8")


@cache
def _template() -> tuple[str, str]:
    """The SQL files in the order they must run, and the marker naming their version."""
    sql = resources.files("ratekeeper.stores.postgres").joinpath("sql")
    names = [
        "schema",
        *(name for name in ALGORITHM_FILES if sql.joinpath(f"{name}.sql").is_file()),
        "decide",
        "decide_single",
    ]
    body = "\n".join(_sql_file(name) for name in names)
    return body, "ratekeeper " + hashlib.blake2b(body.encode(), digest_size=8).hexdigest()


def migration_sql(schema: str = "ratekeeper", table: str = "state", unlogged: bool = False) -> str:
    """The SQL that creates (or updates) the schema, table and functions; idempotent.

    The decide function's comment records a digest of the files (not of the names, nor of
    the UNLOGGED choice, which applies only when the table is created), so a store can
    tell whether the installed functions are the ones it ships.
    """
    _identifier("schema", schema)
    _identifier("table", table)
    body, marker = _template()
    text = body.replace("@schema@", schema).replace("@table@", table)
    text = text.replace("@unlogged@", "UNLOGGED" if unlogged else "")
    return f"{text}\nCOMMENT ON FUNCTION {schema}.{table}_decide(text[], text) IS '{marker}';\n"


class PostgresCore:
    """Statements and decoding for one PostgreSQL store."""

    def __init__(self, url: str, **options: Any) -> None:
        self.options = opts = PostgresOptions(url, **options)
        self.timeout = opts.timeout
        self.migrate_timeout = max(60.0, opts.timeout)
        self.decide_sql = f"SELECT {opts.schema}.{opts.table}_decide(%s::text[], %s::text)"
        self.decide_one_sql = f"SELECT {opts.schema}.{opts.table}_decide(ARRAY[%s::text], %s::text)"
        self.gcra_one_sql = f"SELECT {opts.schema}.{opts.table}_gcra_one(%s::text, %s::text)"
        self.decide_single_sql = f"SELECT {opts.schema}.{opts.table}_decide_single(%s::text, %s::text)"
        # The statements of one key, prepared by name on each connection: the sync shell runs
        # them through libpq directly (PQexecPrepared, text in and out), a third of the
        # client's cost of a psycopg cursor.
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
        self.marker = _template()[1]
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
            f"{log}(%s::text, %s::numeric[], NULL, 1000, '{{1,10}}', 1, false), "
            f"{log}(%s::text, %s::numeric[], NULL, 1000, '{{1,10}}', 50, true)",
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

    def call(self, ops: Sequence[wire.Op], now: int | None, atomic: bool = False) -> tuple[str, tuple[Any, ...]]:
        """The statement and parameters deciding ``ops`` in one round trip: a lone decide or
        peek takes ``<table>_gcra_one`` for a one-limit GCRA rule (the least arithmetic) and
        ``<table>_decide_single`` for any other rule (the same decision without the general
        function's loops and working copies); every other call takes ``<table>_decide``."""
        if len(ops) == 1 and ops[0][0] != wire.REFUND:
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
    def decode(ops: Sequence[wire.Op], reply: Any) -> list[Decision | bool]:
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


def sever(conn: Any) -> None:
    """Shut down ``conn``'s socket: a read blocked on it (a paused or vanished server, which
    no ``statement_timeout`` can end) returns at once with an error, and the pool drops
    the connection. Acts on the socket, not on a descriptor, so libpq's own stays valid."""
    import os
    import socket

    with contextlib.suppress(Exception):
        fd = conn.pgconn.socket
        dup = socket.socket(fileno=os.dup(fd))
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()


def disown(conns: Any) -> None:
    """In a forked child: point each inherited connection's socket at ``/dev/null``, so that
    nothing the child does with it (closing it, or its collection sending libpq's Terminate)
    reaches the server on the parent's session. The parent's socket is untouched."""
    import os

    null = os.open(os.devnull, os.O_RDWR)
    try:
        for conn in conns:
            with contextlib.suppress(Exception):
                os.dup2(null, conn.pgconn.socket)
    finally:
        os.close(null)


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection (or the server) went away: the pool's idle
    connections are then suspect and are checked."""
    import psycopg

    return isinstance(exc, psycopg.OperationalError) and not isinstance(exc, psycopg.errors.QueryCanceled)


def translate(exc: BaseException, what: str) -> StoreError:
    """Our exception for a psycopg / psycopg_pool one (the caller chains it with ``from exc``)."""
    import psycopg
    import psycopg_pool

    if isinstance(exc, psycopg.errors.QueryCanceled):
        return StoreTimeout(f"PostgreSQL did not finish {what} within the statement timeout: {exc}")
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg.errors.ConnectionTimeout | TimeoutError):
        return StoreTimeout(f"PostgreSQL did not answer {what} in time: {exc}")
    if isinstance(exc, psycopg.OperationalError | psycopg_pool.PoolClosed | OSError):
        return StoreError(f"PostgreSQL is unreachable for {what}: {exc}")
    return StoreError(f"PostgreSQL failed {what}: {exc}")


FIRST_CONNECT_SLICE = 0.02
"""Seconds a call waits at a time for the pool's first connection, between looks at what
the connection attempts found (``Connects``)."""

# What a server's refusal says when retrying cannot change it: a missing role or database,
# a failed authentication, no pg_hba.conf entry, no right to connect.
_FINAL_REFUSALS = (
    "does not exist",
    "authentication failed",
    "pg_hba.conf",
    "permission denied",
    "no password supplied",
    "password is required",
)


class Connects:
    """What the pool's connection attempts found: the shells' connection class records
    each attempt (``failed`` / ``succeeded``), from the pool's worker threads or tasks.

    Until a first connection succeeds, a call that needs one does not wait the whole
    timeout for it: the error of the last attempt is raised at once as a ``StoreError``
    with the server's own reason (``refusal``), and when retrying cannot fix it
    (``final``) the shell closes the pool, so its background retries stop instead of
    logging the same refusal again and again.
    """

    __slots__ = ("connected", "error")

    def __init__(self) -> None:
        self.connected = False
        self.error: BaseException | None = None

    def failed(self, exc: BaseException) -> None:
        self.error = exc

    def succeeded(self) -> None:
        self.connected = True
        self.error = None

    def final(self) -> bool:
        """Whether no connection was ever made and the last attempt failed for a reason that
        retrying cannot fix (the server refused this role, database or password; or the
        client refused the connection options)."""
        import psycopg

        error = self.error
        if self.connected or error is None:
            return False
        if not isinstance(error, psycopg.OperationalError):
            return True  # the client refused the options: no retry changes them
        text = str(error)
        return "FATAL" in text and any(reason in text for reason in _FINAL_REFUSALS)


def refusal(exc: BaseException, what: str) -> StoreError:
    """The ``StoreError`` of a connection attempt that failed, with its own reason (the caller
    chains it with ``from exc``)."""
    reason = " ".join(str(exc).split())
    reason = reason.removeprefix("connection failed: ")
    return StoreError(f"could not connect to PostgreSQL for {what}: {reason}")


def applied_nothing(exc: BaseException) -> bool:
    """Whether a failed statement (``exc``, translated, its psycopg error chained) applied
    nothing because of the data it was given: the server refused it with a data, integrity
    or PL/pgSQL error (an autocommit statement that fails is rolled back whole), so its
    ops may be decided again apart. Not a lost connection, a timeout or a cancel (whether
    it committed is unknown), nor a missing function (every part would fail alike)."""
    import psycopg

    cause = exc.__cause__
    return (
        isinstance(exc, StoreError)
        and not isinstance(exc, StoreTimeout)
        and isinstance(
            cause, psycopg.DataError | psycopg.IntegrityError | psycopg.InternalError | psycopg.NotSupportedError
        )
        and getattr(cause, "sqlstate", None) is not None
    )


def store_down(exc: BaseException) -> bool:
    """Whether ``exc`` (translated, its psycopg error chained) says PostgreSQL is unreachable
    or timed out: a connection lost, refused or severed by the client-side deadline, a
    statement past its timeout, the server shutting down (psycopg's ``OperationalError``).
    The calls queued behind the failed one then get the same error instead of waiting
    their turn. Not when one statement was wrong, nor when this process's pool had no
    connection free in time (``PoolTimeout``)."""
    import psycopg
    import psycopg_pool

    cause = exc.__cause__
    if not isinstance(exc, StoreError) or cause is None or isinstance(cause, psycopg_pool.PoolTimeout):
        return False
    return isinstance(exc, StoreTimeout) or isinstance(cause, psycopg.OperationalError | OSError)
