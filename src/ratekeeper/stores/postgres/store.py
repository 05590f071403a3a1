"""``PostgresStore``: the PostgreSQL store for ``Limiter`` (threads), over ``postgres_core``.

One decision is one statement, ``SELECT <schema>.<table>_decide(keys, request)``: a
PL/pgSQL function that locks the rows it needs in one order, reads ``clock_timestamp()``,
decides every op with the algorithm's function and writes back, all inside that statement
(no lock outlives it, no read-then-write round trips); a lone GCRA call of a one-limit
rule runs ``<table>_gcra_one`` instead, the same steps without the dispatch. Statements of
one key are prepared by name on each connection and run through libpq directly.
``try_acquire_many`` is one statement too. Calls from several threads coalesce
(``ThreadCoalescer``, ``stores/coalescing.py``, with its guarantees): at most
``max_in_flight`` statements are out and at most one per row; the others queue, and the
first of them sends what may go as one statement when one returns.
A call keeps its connection for the next one (no pool round trip) unless it failed. A
watchdog bounds every statement by the timeout on the client side too. The schema is
installed on first use (or by ``ratekeeper migrate``).

The statements themselves are ``PostgresCalls`` (``postgres_calls.py``, generated from
``postgres_calls_async.py``); this module holds what threads do differently.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.stores import wire
from ratekeeper.stores.coalescing import Coalescer
from ratekeeper.stores.coalescing_threads import ThreadCoalescer
from ratekeeper.stores.postgres.calls import PostgresCalls
from ratekeeper.stores.postgres.sansio import MAX_BATCH, Connects, applied_nothing, disown, row, sever, store_down

if TYPE_CHECKING:
    from ratekeeper.decision import Decision

__all__ = ["PostgresStore"]


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


class PostgresStore(PostgresCalls):
    """The PostgreSQL store (``postgresql://``, ``postgres://``); see ``PostgresOptions``."""

    def __init__(self, url: str = "postgresql://postgres@127.0.0.1:5432/postgres", **options: Any) -> None:
        super().__init__(url, **options)
        self._open_pool()
        _stores.add(self)

    def _open_pool(self) -> None:
        """A new pool, and the lock, queue and watchdog of this process."""
        from psycopg_pool import ConnectionPool

        opts = self.core.options
        self.pool = ConnectionPool(
            opts.conninfo,
            kwargs=opts.connection_kwargs(),
            min_size=opts.min_size,
            max_size=opts.max_size,
            configure=self._configure,
            connection_class=_recording(self.connects),
            timeout=opts.timeout,
            reconnect_timeout=max(60.0, opts.timeout),
            name="ratekeeper",
            open=False,
        )
        self.pool.open(wait=False)
        self._schema_lock = threading.Lock()
        self._coalescer: ThreadCoalescer[wire.Op, Decision | bool] = ThreadCoalescer(
            Coalescer(opts.max_in_flight, MAX_BATCH, row, one_call_per_row=True),
            self._run,
            store_down,
            opts.timeout,
            "PostgreSQL",
            applied_nothing,
        )
        self._watchdog = _Watchdog(tick=min(0.05, opts.timeout / 4))

    def _after_fork_in_child(self) -> None:
        """The child of a fork starts afresh: the connections it inherited are the parent's
        sessions (their sockets shared), so they are disowned and kept from collection,
        never used nor closed; and the threads of the pool and the watchdog, and whatever
        other threads held, did not survive the fork."""
        inherited = [*self._kept, *getattr(self.pool, "_pool", ())]
        disown(inherited)
        _inherited.append((self.pool, inherited))
        self._kept = []
        self._warm = weakref.WeakSet()
        self._open_pool()

    # -- what differs from the asyncio store ---------------------------------------------

    def _pool(self) -> Any:
        return self.pool

    def _arm(self, conn: Any, seconds: float) -> int:
        return self._watchdog.arm(conn, seconds)

    def _disarm(self, deadline: int) -> bool:
        return self._watchdog.disarm(deadline)

    def _ready_lock(self) -> threading.Lock:
        return self._schema_lock

    def _exec_prepared(self, conn: Any, name: bytes, params: Sequence[str]) -> Any:
        """Run the prepared statement ``name`` in one libpq call (PQexecPrepared: the GIL is
        released while it waits; a third of a psycopg cursor's cost), its reply as text."""
        encoding = conn.info.encoding
        return self._prepared_reply(conn, conn.pgconn.exec_prepared(name, [p.encode(encoding) for p in params]))

    def _submit(self, op: wire.Op, now: int | None) -> Decision | bool:
        if not self.core.options.batching:
            return self._run([op], now)[0]
        return self._coalescer.submit(op, now)

    def close(self) -> None:
        self._closing = True
        self._watchdog.close()
        self._return_kept()
        self.pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_stores: weakref.WeakSet[PostgresStore] = weakref.WeakSet()
_inherited: list[Any] = []
"""What forked children inherited: never closed nor collected there (the parent's sessions)."""


def _after_fork() -> None:
    for store in list(_stores):
        store._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork)


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
