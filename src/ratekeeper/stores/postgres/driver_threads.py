"""What the blocking PostgreSQL store does its own way (``driver_asyncio.py`` is the asyncio
store's): a watchdog thread bounds each statement, a prepared statement runs in one libpq
call (the GIL released while it waits), calls wait their turn as threads
(``ThreadCoalescer``), the pool opens as the store is made, and a forked child starts
afresh. ``shell.py`` and ``store.py`` (generated) import these names.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.stores.coalescing_threads import ThreadCoalescer
from ratekeeper.stores.postgres.errors import applied_nothing, store_down
from ratekeeper.stores.postgres.planner import queue
from ratekeeper.stores.postgres.sockets import disown, sever

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.stores import wire
    from ratekeeper.stores.postgres.options import PostgresOptions

__all__ = ["POOL_NAME", "Deadlines", "Lock", "coalescer", "exec_prepared", "started"]

POOL_NAME = "ratekeeper"
Lock = threading.Lock


class Deadlines:
    """Client-side deadlines: a statement still waiting for its reply at its deadline has
    its connection severed (``sever``), so no call outlives the timeout by more than a
    tick, whatever the server does. One daemon thread per store that looks once a tick."""

    def __init__(self, timeout: float) -> None:
        self.tick = min(0.05, timeout / 4)
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


def exec_prepared(conn: Any, name: bytes, params: Sequence[str]) -> Any:
    """Run the prepared statement ``name`` in one libpq call (PQexecPrepared: the GIL is
    released while it waits, and no cursor is made), its text reply's result."""
    encoding = conn.info.encoding
    return conn.pgconn.exec_prepared(name, [p.encode(encoding) for p in params])


def coalescer(
    run: Callable[[Sequence[wire.Op], int | None], Sequence[Decision | bool]], options: PostgresOptions
) -> ThreadCoalescer[wire.Op, Decision | bool]:
    """How concurrent threads wait their turn in ``queue``: the first queued sends for all."""
    return ThreadCoalescer(queue(options), run, store_down, options.timeout, "PostgreSQL", applied_nothing)


def started(store: Any) -> None:
    """Open ``store``'s pool now (connecting starts at once), and start it afresh in the child
    of a fork."""
    store.shell.open_pool()
    _stores.add(store)


_stores: weakref.WeakSet[Any] = weakref.WeakSet()
_inherited: list[Any] = []
"""What forked children inherited: never closed nor collected there (the parent's sessions)."""


def _after_fork() -> None:
    """The child of a fork starts afresh: the connections it inherited are the parent's
    sessions (their sockets shared), so they are disowned and kept from collection, never
    used nor closed; and the threads of the pool and the watchdog, and whatever other
    threads held, did not survive the fork."""
    for store in list(_stores):
        shell = store.shell
        inherited = [*shell.kept, *getattr(shell.pool, "_pool", ())]
        disown(inherited)
        _inherited.append((shell.pool, inherited))
        store._open()
        store.shell.ready = shell.ready  # the schema is as the parent found it
        store.shell.open_pool()


os.register_at_fork(after_in_child=_after_fork)
