"""PostgreSQL's own counters around a run: deadlocks, and lock waits sampled while it runs.

``pg_stat_database.deadlocks`` is cumulative for the database (other clients of the same
database move it too, so a move is reported, not attributed). PostgreSQL keeps no counter
of lock waits, so a thread samples ``pg_stat_activity`` every 50 ms for the run's own
connections (the store's ``application_name``) waiting on a lock, how long the longest of
them has waited (``pg_locks.waitstart``), and ``pg_locks`` for any lock not granted in the
database; the statistics snapshot is cleared before each read so the numbers are current.

Two instances deciding for the same user at the same moment do wait on that user's row for
each other: that is how the store serializes the row's updates. What must not happen is a
wait that outlives a statement, as the partner team's earlier design had (locks held across
round trips): a wait reaching ``deadlock_timeout`` (1 s by default, the point at which
PostgreSQL looks for a deadlock and ``log_lock_waits`` logs the wait) is what the run flags.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import psycopg

_COUNTERS = """
SELECT (SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()),
       (SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name = %s),
       (SELECT coalesce(max(extract(epoch FROM clock_timestamp() - l.waitstart)), 0)
          FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE NOT l.granted AND a.application_name = %s),
       (SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
         WHERE NOT l.granted AND d.datname = current_database()),
       (SELECT extract(epoch FROM current_setting('deadlock_timeout')::interval))
"""


@dataclass
class LockWatch:
    """What the sampler saw: samples taken, and samples with a waiter (ours, or anyone's)."""

    samples: int = 0
    ours_waiting: int = 0
    longest_wait: float = 0.0
    any_ungranted: int = 0
    deadlock_timeout: float = 1.0
    deadlocks_before: int = 0
    deadlocks_after: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "deadlocks_before": self.deadlocks_before,
            "deadlocks_after": self.deadlocks_after,
            "deadlocks_moved": self.deadlocks_after - self.deadlocks_before,
            "lock_samples": self.samples,
            "samples_with_our_lock_waits": self.ours_waiting,
            "longest_lock_wait_ms": round(self.longest_wait * 1000, 3),
            "deadlock_timeout_ms": self.deadlock_timeout * 1000,
            "lock_waits_reaching_deadlock_timeout": self.longest_wait >= self.deadlock_timeout,
            "samples_with_ungranted_locks_in_db": self.any_ungranted,
            "errors": self.errors,
        }


class PgWatcher:
    """``with PgWatcher(dsn, app_name) as watch:`` samples until the block ends."""

    def __init__(self, dsn: str, app_name: str, interval: float = 0.05) -> None:
        self.dsn, self.app_name, self.interval = dsn, app_name, interval
        self.watch = LockWatch()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="pg-lock-sampler", daemon=True)

    def _read(self, conn: psycopg.Connection[Any]) -> tuple[int, int, float, int]:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(_COUNTERS, (self.app_name, self.app_name)).fetchone()
        assert row is not None
        self.watch.deadlock_timeout = float(row[4])
        return int(row[0]), int(row[1]), float(row[2]), int(row[3])

    def __enter__(self) -> LockWatch:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            self.watch.deadlocks_before = self._read(conn)[0]
        self._thread.start()
        return self.watch

    def _sample(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                while not self._stop.wait(self.interval):
                    _, ours, waited, anyone = self._read(conn)
                    self.watch.samples += 1
                    self.watch.ours_waiting += ours > 0
                    self.watch.longest_wait = max(self.watch.longest_wait, waited)
                    self.watch.any_ungranted += anyone > 0
        except psycopg.Error as exc:
            self.watch.errors.append(repr(exc))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        # every request of the run has been answered by now, so a deadlock among its statements
        # has already been detected (and counted) or ended by the statement timeout (an error)
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            self.watch.deadlocks_after = self._read(conn)[0]
