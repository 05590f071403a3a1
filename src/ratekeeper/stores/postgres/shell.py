"""How the blocking PostgreSQL store sends what ``PostgresPlanner`` plans: the pool, the kept
connection, prepared statements, the warm-up, the client-side deadline, the migration.

Generated from ``shell_async.py`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Sequence
from typing import Any

from ratekeeper.errors import StoreTimeout
from ratekeeper.stores.postgres.driver_threads import POOL_NAME, Deadlines, Lock, exec_prepared
from ratekeeper.stores.postgres.errors import FIRST_CONNECT_SLICE, Connects, connection_lost, refusal, translate
from ratekeeper.stores.postgres.planner import PostgresPlanner

__all__ = ["RETURN_EVERY", "PostgresShell"]

log = logging.getLogger("ratekeeper.store")

RETURN_EVERY = 1000
"""A kept connection goes back to the pool once in this many calls (the pool's lifetime checks)."""


class PostgresShell:
    """Runs statements on a psycopg pool and hands back their first rows.

    A call keeps its connection for the next one (no pool round trip): connections go
    back to the pool after a failure, on close, before a migration, when one was lost,
    and once in ``RETURN_EVERY`` calls. The schema is checked (and installed when it is
    not current) before the first statement that needs it (``ensure``).
    """

    def __init__(self, planner: PostgresPlanner) -> None:
        self.planner = planner
        self.pool: Any = None
        self.ready = False  # the schema is current
        self.closing = False
        self.kept: list[Any] = []  # connections taken from the pool, idle between calls
        self.connects = Connects()  # recorded by the pool's connection class
        self._warm: weakref.WeakSet[Any] = weakref.WeakSet()
        self._uses = 0
        self._lock = Lock()
        self._deadlines = Deadlines(planner.timeout)

    def open_pool(self) -> Any:
        """The pool, opened on first use (it starts connecting in the background)."""
        pool = self.pool
        if pool is None:
            from psycopg_pool import ConnectionPool

            opts = self.planner.options
            pool = ConnectionPool(
                opts.conninfo,
                kwargs=opts.connection_kwargs(),
                min_size=opts.min_size,
                max_size=opts.max_size,
                configure=self._configure,
                connection_class=_recording(self.connects),
                timeout=opts.timeout,
                reconnect_timeout=max(60.0, opts.timeout),
                name=POOL_NAME,
                open=False,
            )
            pool.open(wait=False)
            self.pool = pool
        return pool

    def _configure(self, conn: Any) -> None:
        conn.execute(self.planner.session_sql)

    # -- executing statements ------------------------------------------------------------

    def execute(
        self,
        sql: str,
        params: Sequence[Any],
        what: str,
        deadline: float | None = None,
        prepared: tuple[bytes, bytes] | None = None,
    ) -> Any:
        """One statement on a pooled connection, its reply's first row; no longer than the
        timeout (waiting for a connection, then for the reply, plus a watchdog tick for
        the blocking store). A ``prepared`` statement (``PostgresPlanner.prepared``, text
        parameters) runs by name once the connection has it."""
        import psycopg
        import psycopg_pool

        fired = False
        kept = False
        try:
            conn = self._take(what)
            try:
                seconds = self.planner.timeout if deadline is None else deadline
                deadline_ = self._deadlines.arm(conn, seconds)
                try:
                    if self.ready and conn not in self._warm:
                        self._warm_up(conn, seconds)
                    if prepared is not None and conn in self._warm:
                        result = _prepared_reply(conn, exec_prepared(conn, prepared[0], params))
                    else:
                        cur = conn.execute(sql, params, binary=True)  # binary replies: far cheaper to read
                        result = cur.fetchone() if cur.description is not None else None
                finally:
                    fired = self._deadlines.disarm(deadline_)
                    if fired:
                        conn.close()  # severed: the pool must not hand it out again
                kept = True
                return result
            finally:
                self._give_back(conn, kept)
        except (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
            if fired:
                raise StoreTimeout(f"PostgreSQL did not answer {what} in time (the connection was dropped)") from exc
            if connection_lost(exc):
                self._check_pool()
            raise translate(exc, what) from exc

    def _take(self, what: str) -> Any:
        """A connection: one kept from an earlier call (no pool round trip), else one from
        the pool, waiting at most the timeout (see ``_first_connection`` until the pool has
        made one)."""
        try:
            return self.kept.pop()
        except IndexError:
            pass
        pool = self.open_pool()
        if self.connects.connected:
            return pool.getconn(timeout=self.planner.timeout)
        return self._first_connection(pool, what)

    def _first_connection(self, pool: Any, what: str) -> Any:
        """No connection was made yet: wait for one in short slices, and as soon as an attempt
        has failed raise its own reason as a ``StoreError`` (``errors.Connects``): a wrong
        role, a missing database or a refused port say so at once, instead of a timeout
        that hides them. A reason retrying cannot fix also closes the pool: its background
        retries stop, and every later call gets the same error at once."""
        import psycopg_pool

        connects = self.connects
        deadline = time.monotonic() + self.planner.timeout
        while True:
            left = max(0.001, deadline - time.monotonic())
            if connects.connected:  # made meanwhile: wait as any call does, for what is left
                return pool.getconn(timeout=left)
            error = connects.error
            if error is not None:
                if connects.final():
                    with contextlib.suppress(Exception):
                        pool.close(timeout=1.0)  # its workers are idle: they stop at once
                raise refusal(error, what) from error
            try:
                return pool.getconn(timeout=min(FIRST_CONNECT_SLICE, left))
            except psycopg_pool.PoolTimeout:
                if time.monotonic() >= deadline:
                    raise

    def _give_back(self, conn: Any, healthy: bool) -> None:
        """Keep ``conn`` for the next call after a statement that succeeded; else give it back
        to the pool (which checks it and drops a broken one)."""
        self._uses += 1
        if healthy and not self.closing and self._uses % RETURN_EVERY:
            self.kept.append(conn)
            return
        pool = self.open_pool()
        pool.putconn(conn)

    def _return_kept(self) -> None:
        """Give every kept connection back to the pool."""
        pool = self.open_pool()
        while True:
            try:
                conn = self.kept.pop()
            except IndexError:
                return
            with contextlib.suppress(Exception):
                pool.putconn(conn)

    def _warm_up(self, conn: Any, seconds: float) -> None:
        """Compile the functions and plan their statements in this new session before it
        locks any row (``PostgresPlanner.warm_up``), and prepare the statements of one key;
        within ``seconds``, the deadline of the call that asked for it."""
        import psycopg
        from psycopg import pq

        planner = self.planner
        try:
            with conn.transaction(force_rollback=True):  # compiled and planned; nothing kept
                conn.execute(planner.local_statement_timeout(seconds))
                conn.execute(*planner.warm_up())
        except psycopg.errors.UndefinedFunction:
            return  # not installed yet: the next call warms it
        pgconn = conn.pgconn
        for name, text in planner.prepared.values():
            res = pgconn.prepare(name, text)  # one short exchange, once per connection
            if res.status != pq.ExecStatus.COMMAND_OK and res.error_field(pq.DiagnosticField.SQLSTATE) != b"42P05":
                raise psycopg.errors.error_from_result(res, conn.info.encoding)  # 42P05: already prepared
        self._warm.add(conn)

    def _check_pool(self) -> None:
        """A connection died: replace the idle ones that died with it (a server restart)."""
        self._return_kept()
        pool = self.open_pool()
        with contextlib.suppress(Exception):  # the pool reconnects in the background anyway
            pool.check()

    # -- the schema ----------------------------------------------------------------------

    def migrate(self) -> None:
        """Install or update the schema, table and functions (idempotent; concurrent
        callers wait on one advisory lock, so one of them does the work)."""
        import psycopg
        import psycopg_pool

        planner = self.planner
        fired = False
        self._return_kept()  # the pool may be short of connections otherwise
        try:
            conn = self._take("the schema migration")
            healthy = False
            try:
                deadline = self._deadlines.arm(conn, planner.migrate_timeout)
                try:
                    with conn.transaction():
                        conn.execute("SET LOCAL statement_timeout = 0")  # the deadline is the client's
                        conn.execute(planner.lock_sql, planner.lock_params)
                        cur = conn.execute(planner.installed_sql, planner.installed_params)
                        installed = cur.fetchone()
                        if not planner.is_current(installed):
                            conn.execute(planner.migration(), prepare=False)
                    healthy = True
                finally:
                    fired = self._deadlines.disarm(deadline)
                    if fired:
                        conn.close()
            finally:
                self._give_back(conn, healthy and not fired)
        except (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
            if fired:
                raise StoreTimeout(f"the schema migration took longer than {planner.migrate_timeout}s") from exc
            raise translate(exc, "the schema migration") from exc
        self.ready = True
        note = planner.unlogged_not_applied(installed)
        if note is not None:
            log.warning("%s", note)

    def ensure(self) -> None:
        """Check the schema once (installing it when it is not current), and warm a first connection."""
        with self._lock:
            if self.ready:
                return
            planner = self.planner
            row = self.execute(planner.installed_sql, planner.installed_params, "the schema check")
            if planner.is_current(row):
                self.ready = True
                note = planner.unlogged_not_applied(row)
                if note is not None:
                    log.warning("%s", note)
            else:
                self.migrate()
            # The first warm-up compiles every function: a loaded server may take longer than
            # a decision's timeout, so this store's first connection is warmed within the
            # migration's timeout, once, instead of failing the first decision.
            self.execute("SELECT 1", (), "the warm-up", planner.migrate_timeout)

    def close(self) -> None:
        """Give the kept connections back and close the pool."""
        self.closing = True
        self._deadlines.close()
        if self.pool is not None:
            self._return_kept()
            self.pool.close()


def _prepared_reply(conn: Any, res: Any) -> Any:
    """The first row of a prepared statement's result (its value as text, which
    ``PostgresPlanner.read`` reads); a failed one raised as psycopg raises it."""
    import psycopg
    from psycopg import pq

    if res.status != pq.ExecStatus.TUPLES_OK:
        pgconn = conn.pgconn
        if pgconn.status == pq.ConnStatus.BAD:
            raise psycopg.OperationalError(pgconn.get_error_message(conn.info.encoding) or "the connection was lost")
        raise psycopg.errors.error_from_result(res, conn.info.encoding)
    return (res.get_value(0, 0),)


def _recording(connects: Connects) -> Any:
    """psycopg's ``Connection``, recording each attempt of the pool in ``connects``."""
    import psycopg

    class RecordingConnection(psycopg.Connection[Any]):
        @classmethod
        def connect(cls, *args: Any, **kwargs: Any) -> Any:
            try:
                conn = super().connect(*args, **kwargs)
            except BaseException as exc:
                connects.failed(exc)
                raise
            connects.succeeded()
            return conn

    return RecordingConnection
