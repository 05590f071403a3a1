"""``PostgresStore``: the PostgreSQL store for ``Limiter`` (a planner and a shell; see ``store_async.py``).

Generated from ``store_async.py`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.stores.bounds import check_op
from ratekeeper.stores.postgres.driver_threads import coalescer, started
from ratekeeper.stores.postgres.planner import PostgresPlanner
from ratekeeper.stores.postgres.shell import PostgresShell

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op
    from ratekeeper.stores import wire

__all__ = ["PostgresStore"]


class PostgresStore:
    """The PostgreSQL store (``postgresql://``, ``postgres://``); see ``PostgresOptions``."""

    def __init__(self, url: str = "postgresql://postgres@127.0.0.1:5432/postgres", **options: Any) -> None:
        self.planner = PostgresPlanner(url, **options)
        self._open()
        started(self)

    def _open(self) -> None:
        """A new shell (no connection yet) and the queue of its calls."""
        self.shell = PostgresShell(self.planner)
        self._coalescer = coalescer(self._run, self.planner.options)

    def _run(self, ops: Sequence[wire.Op], now: int | None, atomic: bool = False) -> list[Decision | bool]:
        """One statement deciding ``ops`` in order (for each refund: whether it gave anything back)."""
        shell = self.shell
        if not shell.ready:
            shell.ensure()
        planner = self.planner
        sql, params = planner.plan(ops, now, atomic)
        return planner.read(ops, shell.execute(sql, params, "a decision", None, planner.prepared.get(sql)))

    def _submit(self, op: wire.Op, now: int | None) -> Decision | bool:
        if self.planner.options.batching:
            return self._coalescer.submit(op, now)
        self._coalescer.bind()
        return (self._run([op], now))[0]

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
        if not self.shell.ready:
            self.shell.ensure()
        sql, params = self.planner.reset(plan, key)
        self.shell.execute(sql, params, "a reset")

    def sweep(self, max_rows: int = 1000) -> int:
        """Delete up to ``max_rows`` idle rows now (the decide function also does this on
        its own, now and then); 0 when another instance holds the sweep."""
        if not self.shell.ready:
            self.shell.ensure()
        row = self.shell.execute(self.planner.sweep_sql, (max_rows,), "a sweep")
        return int(row[0])

    def migrate(self) -> None:
        """Install or update the schema, table and functions (idempotent; concurrent
        callers wait on one advisory lock, so one of them does the work)."""
        self.shell.migrate()

    def close(self) -> None:
        """Answer every op queued or in flight, then close the pool."""
        self.shell.closing = True
        self._coalescer.drain()
        self.shell.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
