"""``PostgresStore``: the PostgreSQL store for ``Limiter`` (threads), over ``postgres_core``.

One decision is one statement, ``SELECT <schema>.<table>_decide(keys, request)``: a
PL/pgSQL function that locks the rows it needs in one order, reads ``clock_timestamp()``,
decides every op with the algorithm's function and writes back, all inside that statement
(no lock outlives it, no read-then-write round trips); a lone GCRA call of a one-limit
rule runs ``<table>_gcra1`` instead, the same steps without the dispatch. Statements of
one key are prepared by name on each connection and run through libpq directly.
``try_acquire_many`` is one statement too. Calls from several threads coalesce
(``Batch``): at most ``max_in_flight`` statements are out and at most one per row; the
others queue, and the first of them sends what may go as one statement when one returns.
A call keeps its connection for the next one (no pool round trip) unless it failed. A
watchdog bounds every statement by the timeout on the client side too. The schema is
installed on first use (or by ``ratekeeper migrate``).
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import StoreTimeout
from ratekeeper.stores import wire
from ratekeeper.stores.postgres_core import Batch, PostgresCore, connection_lost, sever, translate

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.stores.base import Item

__all__ = ["PostgresStore"]

RETURN_EVERY = 1000
"""A kept connection goes back to the pool once in this many calls (the pool's lifetime checks)."""


class _Waiter:
    """A thread waiting for its op: woken once, with a result, an error, or the lead of a
    call (a bare lock, held until then: cheaper than an Event)."""

    __slots__ = ("error", "lead", "result", "signal")

    def __init__(self) -> None:
        self.signal = threading.Lock()
        self.signal.acquire()
        self.result: Decision | None = None
        self.error: BaseException | None = None
        self.lead: tuple[list[wire.Op], int | None, list[_Waiter]] | None = None

    def wait(self) -> None:
        self.signal.acquire()

    def wake(self) -> None:
        self.signal.release()


class _Watchdog:
    """Client-side deadlines: a statement still waiting for its reply at its deadline has
    its connection severed (``sever``), so no call outlives the timeout by more than a
    tick, whatever the server does. One daemon thread per store that looks once a tick."""

    def __init__(self, tick: float) -> None:
        self.tick = tick
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.armed: dict[int, tuple[float, Any]] = {}
        self.fired: set[int] = set()
        self.serial = 0
        self.thread: threading.Thread | None = None
        self.closed = False

    def arm(self, conn: Any, seconds: float) -> int:
        with self.lock:
            self.serial += 1
            token = self.serial
            self.armed[token] = (time.monotonic() + seconds, conn)
            if self.thread is None:
                self.thread = threading.Thread(target=self._watch, name="ratekeeper-pg-watchdog", daemon=True)
                self.thread.start()
        return token

    def disarm(self, token: int) -> bool:
        """Forget ``token``; whether its deadline had passed (its connection is severed)."""
        with self.lock:
            self.armed.pop(token, None)
            if token in self.fired:
                self.fired.discard(token)
                return True
            return False

    def _watch(self) -> None:
        with self.lock:
            while not self.closed:
                self.wake.wait(self.tick)  # never woken per call: a call costs no thread switch
                now = time.monotonic()
                for token, (deadline, conn) in list(self.armed.items()):
                    if now >= deadline:
                        del self.armed[token]
                        self.fired.add(token)
                        sever(conn)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.wake.notify()


class PostgresStore:
    """The PostgreSQL store (``postgresql://``, ``postgres://``); see ``PostgresOptions``."""

    def __init__(self, url: str = "postgresql://postgres@127.0.0.1:5432/postgres", **options: Any) -> None:
        from psycopg_pool import ConnectionPool

        self.core = core = PostgresCore(url, **options)
        opts = core.options
        self.pool = ConnectionPool(
            opts.conninfo,
            kwargs=opts.connection_kwargs(),
            min_size=opts.min_size,
            max_size=opts.max_size,
            configure=self._configure,
            timeout=opts.timeout,
            reconnect_timeout=max(60.0, opts.timeout),
            name="ratekeeper",
            open=False,
        )
        self.pool.open(wait=False)
        self._ready = False
        self._ready_lock = threading.Lock()
        self._lock = threading.Lock()
        self._batch: Batch[_Waiter] = Batch(opts.max_in_flight)
        self._watchdog = _Watchdog(tick=min(0.05, opts.timeout / 4))
        self._warm: weakref.WeakSet[Any] = weakref.WeakSet()
        self._kept: list[Any] = []  # connections taken from the pool, idle between calls
        self._uses = 0
        self._closing = False

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
        timeout (waiting for a connection, then for the reply) plus a watchdog tick. A
        ``prepared`` statement (``PostgresCore.prepared``, text parameters) goes through
        libpq directly once the connection has it."""
        import psycopg
        import psycopg_pool

        watchdog = self._watchdog
        fired = False
        kept = False
        try:
            conn = self._take()
            try:
                token = watchdog.arm(conn, self.core.timeout if deadline is None else deadline)
                try:
                    if self._ready and conn not in self._warm:
                        self._warm_up(conn)
                    if prepared is not None and conn in self._warm:
                        result = self._exec_prepared(conn, prepared[0], params)
                    else:
                        cur = conn.execute(sql, params, binary=True)  # binary replies: far cheaper to read
                        result = cur.fetchone() if cur.description is not None else None
                finally:
                    fired = watchdog.disarm(token)
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

    def _take(self) -> Any:
        """A connection: one this store kept from an earlier call (no pool round trip), else
        one from the pool, waiting at most the timeout."""
        try:
            return self._kept.pop()
        except IndexError:
            return self.pool.getconn(timeout=self.core.timeout)

    def _give_back(self, conn: Any, healthy: bool) -> None:
        """Keep ``conn`` for the next call after a statement that succeeded; give it back to
        the pool after a failure (the pool checks it and drops a broken one), when the pool
        is closing, and once in ``RETURN_EVERY`` calls (so the pool still ages it out)."""
        self._uses += 1
        if healthy and not self._closing and self._uses % RETURN_EVERY:
            self._kept.append(conn)
        else:
            self.pool.putconn(conn)

    def _return_kept(self) -> None:
        """Give every kept connection back to the pool."""
        while True:
            try:
                conn = self._kept.pop()
            except IndexError:
                return
            with contextlib.suppress(Exception):
                self.pool.putconn(conn)

    def _exec_prepared(self, conn: Any, name: bytes, params: Sequence[str]) -> Any:
        """Run the prepared statement ``name`` in one libpq call (the GIL released while it
        waits), its text reply read as ``PostgresCore.text_reply``."""
        import psycopg
        from psycopg import pq

        pgconn = conn.pgconn
        encoding = conn.info.encoding
        res = pgconn.exec_prepared(name, [p.encode(encoding) for p in params])
        if res.status != pq.ExecStatus.TUPLES_OK:
            if pgconn.status == pq.ConnStatus.BAD:
                raise psycopg.OperationalError(pgconn.get_error_message(encoding) or "the connection was lost")
            raise psycopg.errors.error_from_result(res, encoding)
        return self.core.text_reply(res.get_value(0, 0))

    def _warm_up(self, conn: Any) -> None:
        """Compile the functions in this new session before it locks any row, and prepare
        the statements of one key (``PostgresCore.prepared``) on it."""
        import psycopg
        from psycopg import pq

        try:
            with conn.transaction(force_rollback=True):  # compiled and planned; nothing kept
                conn.execute(*self.core.warm_up())
        except psycopg.errors.UndefinedFunction:
            return  # not installed yet: the next call warms it
        pgconn = conn.pgconn
        for name, text in self.core.prepared.values():
            res = pgconn.prepare(name, text)
            if res.status != pq.ExecStatus.COMMAND_OK and res.error_field(pq.DiagnosticField.SQLSTATE) != b"42P05":
                raise psycopg.errors.error_from_result(res, conn.info.encoding)  # 42P05: already prepared
        self._warm.add(conn)

    def _check_pool(self) -> None:
        """A connection died: replace the idle ones that died with it (a server restart)."""
        self._return_kept()
        with contextlib.suppress(Exception):  # the pool reconnects in the background anyway
            self.pool.check()

    def migrate(self) -> None:
        """Install or update the schema, table and functions (idempotent; concurrent
        callers wait on one advisory lock, so one of them does the work)."""
        import psycopg
        import psycopg_pool

        core = self.core
        fired = False
        self._return_kept()  # the pool may be short of connections otherwise
        try:
            with self.pool.connection(timeout=core.timeout) as conn:
                token = self._watchdog.arm(conn, core.migrate_timeout)
                try:
                    with conn.transaction():
                        conn.execute("SET LOCAL statement_timeout = 0")  # the deadline is the watchdog's
                        conn.execute(core.lock_sql, core.lock_params)
                        if not core.is_current(conn.execute(core.installed_sql, core.installed_params).fetchone()):
                            conn.execute(core.migration(), prepare=False)
                finally:
                    fired = self._watchdog.disarm(token)
                    if fired:
                        conn.close()
        except (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
            if fired:
                raise StoreTimeout(f"the schema migration took longer than {core.migrate_timeout}s") from exc
            raise translate(exc, "the schema migration") from exc
        self._ready = True

    def _ensure(self) -> None:
        with self._ready_lock:
            if self._ready:
                return
            row = self._execute(self.core.installed_sql, self.core.installed_params, "the schema check")
            if self.core.is_current(row):
                self._ready = True
            else:
                self.migrate()

    def _run(self, ops: Sequence[wire.Op], now: int | None, atomic: bool = False) -> list[Decision | None]:
        if not self._ready:
            self._ensure()
        sql, params = self.core.call(ops, now, atomic)
        return self.core.decode(ops, self._execute(sql, params, "a decision", None, self.core.prepared.get(sql)))

    def _submit(self, op: wire.Op, now: int | None) -> Decision | None:
        if not self.core.options.batching:
            return self._run([op], now)[0]
        batch = self._batch
        with self._lock:
            if batch.can_send_now(op):
                batch.start([op])
                me = None
            else:
                me = _Waiter()
                batch.queue.append((op, now, me))
        if me is None:
            try:
                return self._run([op], now)[0]
            finally:
                self._finish([op])
        me.wait()
        if me.lead is not None:
            ops, at, waiters = me.lead
            try:
                results = self._run(ops, at)
            except BaseException as exc:  # noqa: BLE001 - every waiter of the call gets the error
                for w in waiters:
                    w.error = exc
                results = []
            else:
                for w, result in zip(waiters, results, strict=True):
                    w.result = result
            finally:
                self._finish(ops)
            for w in waiters:
                if w is not me:
                    w.wake()
        if me.error is not None:
            raise me.error
        return me.result

    def _finish(self, ops: Sequence[wire.Op]) -> None:
        """A statement returned: start the queued ops that may go now, each statement led by
        its first waiter."""
        with self._lock:
            batch = self._batch
            batch.finish(ops)
            leads = []
            while (nxt := batch.take()) is not None:
                leads.append(nxt)
        for lead in leads:
            first = lead[2][0]
            first.lead = lead
            first.wake()

    # -- the Store role ------------------------------------------------------------------

    def decide(
        self,
        plan: Plan,
        key: str,
        cost: int,
        max_wait: int | None = None,
        lease_id: str | None = None,
        now: int | None = None,
        commit: bool = True,
    ) -> Decision:
        decision = self._submit((wire.DECIDE if commit else wire.PEEK, plan, key, cost, max_wait, lease_id), now)
        assert decision is not None
        return decision

    def decide_ops(self, ops: Sequence[wire.Op], now: int | None = None, atomic: bool = False) -> list[Decision | None]:
        """Decide a list of wire ops in one statement, in order (None for each refund)."""
        return self._run(ops, now, atomic)

    def decide_many(self, items: Sequence[Item], now: int | None = None) -> tuple[Decision, ...]:
        decisions = self._run(self.core.many_ops(items), now, atomic=True)
        return tuple(d for d in decisions if d is not None)

    def refund(self, plan: Plan, key: str, cost: int, lease_id: str | None = None, now: int | None = None) -> None:
        self._submit((wire.REFUND, plan, key, cost, None, lease_id), now)

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

    def close(self) -> None:
        self._closing = True
        self._watchdog.close()
        self._return_kept()
        self.pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
