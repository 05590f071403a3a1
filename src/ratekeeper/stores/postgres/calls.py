"""What the blocking PostgreSQL store runs and how: connections, statements, the schema, errors.

Generated from ``calls_async.py`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import StoreTimeout
from ratekeeper.stores import wire
from ratekeeper.stores.bounds import check_op
from ratekeeper.stores.postgres.sansio import (
    FIRST_CONNECT_SLICE,
    Connects,
    PostgresCore,
    connection_lost,
    refusal,
    translate,
)

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op

__all__ = ["RETURN_EVERY", "PostgresCalls"]

log = logging.getLogger("ratekeeper.store")

RETURN_EVERY = 1000
"""A kept connection goes back to the pool once in this many calls (the pool's lifetime checks)."""


class PostgresCalls:
    """The statements of a PostgreSQL store on a psycopg pool, planned by ``postgres_core``.

    A call keeps its connection for the next one (no pool round trip): connections go
    back to the pool after a failure, on close, before a migration, when one was lost,
    and once in ``RETURN_EVERY`` calls. The shells provide ``_pool`` (the open pool),
    ``_arm`` / ``_disarm`` (the client-side deadline), ``_exec_prepared``, ``_submit``
    and ``_ready_lock``.
    """

    def __init__(self, url: str, **options: Any) -> None:
        self.core = PostgresCore(url, **options)
        self._ready = False
        self._warm: weakref.WeakSet[Any] = weakref.WeakSet()
        self._kept: list[Any] = []  # connections taken from the pool, idle between calls
        self._uses = 0
        self._closing = False
        self.connects = Connects()  # recorded by the shells' connection class

    def _configure(self, conn: Any) -> None:
        conn.execute(self.core.session_sql)

    # -- executing statements ------------------------------------------------------------

    def _execute(
        self,
        sql: str,
        params: Sequence[Any],
        what: str,
        deadline: float | None = None,
        prepared: tuple[bytes, bytes] | None = None,
    ) -> Any:
        """One statement on a pooled connection, its reply's first row; no longer than the
        timeout (waiting for a connection, then for the reply, plus a watchdog tick for
        the blocking store). A ``prepared`` statement (``PostgresCore.prepared``, text
        parameters) runs by name once the connection has it."""
        import psycopg
        import psycopg_pool

        fired = False
        kept = False
        try:
            conn = self._take(what)
            try:
                seconds = self.core.timeout if deadline is None else deadline
                deadline_ = self._arm(conn, seconds)
                try:
                    if self._ready and conn not in self._warm:
                        self._warm_up(conn, seconds)
                    if prepared is not None and conn in self._warm:
                        result = self._exec_prepared(conn, prepared[0], params)
                    else:
                        cur = conn.execute(sql, params, binary=True)  # binary replies: far cheaper to read
                        result = cur.fetchone() if cur.description is not None else None
                finally:
                    fired = self._disarm(deadline_)
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
        """A connection: one this store kept from an earlier call (no pool round trip), else
        one from the pool, waiting at most the timeout (see ``_first_connection`` until the
        pool has made one)."""
        try:
            return self._kept.pop()
        except IndexError:
            pass
        pool = self._pool()
        if self.connects.connected:
            return pool.getconn(timeout=self.core.timeout)
        return self._first_connection(pool, what)

    def _first_connection(self, pool: Any, what: str) -> Any:
        """No connection was made yet: wait for one in short slices, and as soon as an attempt
        has failed raise its own reason as a ``StoreError`` (``sansio.Connects``): a wrong
        role, a missing database or a refused port say so at once, instead of a timeout
        that hides them. A reason retrying cannot fix also closes the pool: its background
        retries stop, and every later call gets the same error at once."""
        import psycopg_pool

        connects = self.connects
        deadline = time.monotonic() + self.core.timeout
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
        if healthy and not self._closing and self._uses % RETURN_EVERY:
            self._kept.append(conn)
            return
        pool = self._pool()
        pool.putconn(conn)

    def _return_kept(self) -> None:
        """Give every kept connection back to the pool."""
        pool = self._pool()
        while True:
            try:
                conn = self._kept.pop()
            except IndexError:
                return
            with contextlib.suppress(Exception):
                pool.putconn(conn)

    def _warm_up(self, conn: Any, seconds: float) -> None:
        """Compile the functions and plan their statements in this new session before it
        locks any row (``PostgresCore.warm_up``), and prepare the statements of one key;
        within ``seconds``, the deadline of the call that asked for it."""
        import psycopg
        from psycopg import pq

        try:
            with conn.transaction(force_rollback=True):  # compiled and planned; nothing kept
                conn.execute(self.core.local_statement_timeout(seconds))
                conn.execute(*self.core.warm_up())
        except psycopg.errors.UndefinedFunction:
            return  # not installed yet: the next call warms it
        pgconn = conn.pgconn
        for name, text in self.core.prepared.values():
            res = pgconn.prepare(name, text)  # one short exchange, once per connection
            if res.status != pq.ExecStatus.COMMAND_OK and res.error_field(pq.DiagnosticField.SQLSTATE) != b"42P05":
                raise psycopg.errors.error_from_result(res, conn.info.encoding)  # 42P05: already prepared
        self._warm.add(conn)

    @staticmethod
    def _prepared_reply(conn: Any, res: Any) -> Any:
        """The first row of a prepared statement's result (its value as text, which
        ``PostgresCore.decode`` reads); a failed one raised as psycopg raises it."""
        import psycopg
        from psycopg import pq

        if res.status != pq.ExecStatus.TUPLES_OK:
            pgconn = conn.pgconn
            if pgconn.status == pq.ConnStatus.BAD:
                raise psycopg.OperationalError(
                    pgconn.get_error_message(conn.info.encoding) or "the connection was lost"
                )
            raise psycopg.errors.error_from_result(res, conn.info.encoding)
        return (res.get_value(0, 0),)

    def _check_pool(self) -> None:
        """A connection died: replace the idle ones that died with it (a server restart)."""
        self._return_kept()
        pool = self._pool()
        with contextlib.suppress(Exception):  # the pool reconnects in the background anyway
            pool.check()

    def migrate(self) -> None:
        """Install or update the schema, table and functions (idempotent; concurrent
        callers wait on one advisory lock, so one of them does the work)."""
        import psycopg
        import psycopg_pool

        core = self.core
        fired = False
        self._return_kept()  # the pool may be short of connections otherwise
        try:
            conn = self._take("the schema migration")
            healthy = False
            try:
                deadline = self._arm(conn, core.migrate_timeout)
                try:
                    with conn.transaction():
                        conn.execute("SET LOCAL statement_timeout = 0")  # the deadline is the watchdog's
                        conn.execute(core.lock_sql, core.lock_params)
                        cur = conn.execute(core.installed_sql, core.installed_params)
                        installed = cur.fetchone()
                        if not core.is_current(installed):
                            conn.execute(core.migration(), prepare=False)
                    healthy = True
                finally:
                    fired = self._disarm(deadline)
                    if fired:
                        conn.close()
            finally:
                self._give_back(conn, healthy and not fired)
        except (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
            if fired:
                raise StoreTimeout(f"the schema migration took longer than {core.migrate_timeout}s") from exc
            raise translate(exc, "the schema migration") from exc
        self._ready = True
        note = core.unlogged_not_applied(installed)
        if note is not None:
            log.warning("%s", note)

    def _ensure(self) -> None:
        with self._ready_lock():
            if self._ready:
                return
            row = self._execute(self.core.installed_sql, self.core.installed_params, "the schema check")
            if self.core.is_current(row):
                self._ready = True
                note = self.core.unlogged_not_applied(row)
                if note is not None:
                    log.warning("%s", note)
            else:
                self.migrate()
            # The first warm-up compiles every function: a loaded server may take longer than
            # a decision's timeout, so this store's first connection is warmed within the
            # migration's timeout, once, instead of failing the first decision.
            self._execute("SELECT 1", (), "the warm-up", self.core.migrate_timeout)

    def _run(self, ops: Sequence[wire.Op], now: int | None, atomic: bool = False) -> list[Decision | bool]:
        if not self._ready:
            self._ensure()
        sql, params = self.core.call(ops, now, atomic)
        reply = self._execute(sql, params, "a decision", None, self.core.prepared.get(sql))
        return self.core.decode(ops, reply)

    # -- the Store role ------------------------------------------------------------------

    def decide(self, op: Op, now: int | None = None) -> Decision:
        check_op(op, now)
        decision = self._submit(op, now)
        assert not isinstance(decision, bool)
        return decision

    def decide_ops(self, ops: Sequence[wire.Op], now: int | None = None, atomic: bool = False) -> list[Decision | bool]:
        """Decide a list of wire ops in one statement, in order (for each refund: whether it gave anything back)."""
        for op in ops:
            check_op(op, now)
        return self._run(ops, now, atomic)

    def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        for op in ops:
            check_op(op, now)
        decisions = self._run(ops, now, atomic=True)
        return tuple(d for d in decisions if not isinstance(d, bool))

    def refund(self, op: Op, now: int | None = None) -> bool:
        check_op(op, now)
        return self._submit(op, now) is True

    def reset(self, plan: Plan, key: str) -> None:
        if not self._ready:
            self._ensure()
        sql, params = self.core.reset(plan, key)
        self._execute(sql, params, "a reset")

    def sweep(self, max_rows: int = 1000) -> int:
        """Delete up to ``max_rows`` idle rows now (the decide function also does this on
        its own, now and then); 0 when another instance holds the sweep."""
        if not self._ready:
            self._ensure()
        row = self._execute(self.core.sweep_sql, (max_rows,), "a sweep")
        return int(row[0])

    # -- what the shells provide ---------------------------------------------------------

    def _pool(self) -> Any:
        raise NotImplementedError

    def _arm(self, conn: Any, seconds: float) -> Any:
        """Start the client-side deadline of a statement on ``conn``."""
        raise NotImplementedError

    def _disarm(self, deadline: Any) -> bool:
        """Stop it; whether it had passed (``conn`` was severed)."""
        raise NotImplementedError

    def _exec_prepared(self, conn: Any, name: bytes, params: Sequence[str]) -> Any:
        raise NotImplementedError

    def _submit(self, op: wire.Op, now: int | None) -> Decision | bool:
        raise NotImplementedError

    def _ready_lock(self) -> Any:
        """The lock that one schema check at a time holds."""
        raise NotImplementedError
