"""``AsyncPostgresStore``: the PostgreSQL store for ``AsyncLimiter``.

One decision is one statement, ``SELECT <schema>.<table>_decide(keys, request)``: a
PL/pgSQL function that locks the rows it needs in one order, reads ``clock_timestamp()``,
decides every op with the algorithm's function and writes back, all inside that statement
(no lock outlives it, no read-then-write round trips); a lone op runs a function of its
own (``PostgresPlanner.plan``). ``try_acquire_many`` is one statement too. Concurrent calls
coalesce (``stores/coalescing.py``, with its guarantees): at most ``max_in_flight``
statements are out and at most one per row; the others queue, and go as one statement
when one returns. A client-side deadline bounds every statement. The schema is installed
on first use (or by ``ratekeeper migrate``).

The store holds a planner (what to send, how to read it) and a shell (``shell_async.py``:
sends it). The source of ``store.py``: ``tools/unasync.py`` writes ``PostgresStore`` from
it; what the two must do differently comes from ``driver_asyncio.py`` /
``driver_threads.py``. An asyncio store belongs to the event loop it is first used on
(psycopg's async pool and connections cannot move between loops).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.stores.bounds import check_op
from ratekeeper.stores.postgres.driver_asyncio import coalescer, started
from ratekeeper.stores.postgres.planner import PostgresPlanner
from ratekeeper.stores.postgres.shell_async import AsyncPostgresShell

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op
    from ratekeeper.stores import wire

__all__ = ["AsyncPostgresStore"]


class AsyncPostgresStore:
    """The PostgreSQL store (``postgresql://``, ``postgres://``); see ``PostgresOptions``."""

    def __init__(self, url: str = "postgresql://postgres@127.0.0.1:5432/postgres", **options: Any) -> None:
        self.planner = PostgresPlanner(url, **options)
        self._open()
        started(self)

    def _open(self) -> None:
        """A new shell (no connection yet) and the queue of its calls."""
        self.shell = AsyncPostgresShell(self.planner)
        self._coalescer = coalescer(self._run, self.planner.options)

    async def _run(self, ops: Sequence[wire.Op], now: int | None, atomic: bool = False) -> list[Decision | bool]:
        """One statement deciding ``ops`` in order (for each refund: whether it gave anything back)."""
        shell = self.shell
        if not shell.ready:
            await shell.ensure()
        planner = self.planner
        sql, params = planner.plan(ops, now, atomic)
        return planner.read(ops, await shell.execute(sql, params, "a decision", None, planner.prepared.get(sql)))

    async def _submit(self, op: wire.Op, now: int | None) -> Decision | bool:
        if self.planner.options.batching:
            return await self._coalescer.submit(op, now)
        self._coalescer.bind()
        return (await self._run([op], now))[0]

    # -- the Store role ------------------------------------------------------------------

    async def decide(self, op: Op, now: int | None = None) -> Decision:
        check_op(op, now)
        decision = await self._submit(op, now)
        assert not isinstance(decision, bool)
        return decision

    async def decide_ops(
        self, ops: Sequence[wire.Op], now: int | None = None, atomic: bool = False
    ) -> list[Decision | bool]:
        """Decide a list of wire ops in one statement, in order (for each refund: whether it gave anything back)."""
        for op in ops:
            check_op(op, now)
        return await self._run(ops, now, atomic)

    async def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        for op in ops:
            check_op(op, now)
        decisions = await self._run(ops, now, atomic=True)
        return tuple(d for d in decisions if not isinstance(d, bool))

    async def refund(self, op: Op, now: int | None = None) -> bool:
        check_op(op, now)
        return await self._submit(op, now) is True

    async def reset(self, plan: Plan, key: str) -> None:
        if not self.shell.ready:
            await self.shell.ensure()
        sql, params = self.planner.reset(plan, key)
        await self.shell.execute(sql, params, "a reset")

    async def sweep(self, max_rows: int = 1000) -> int:
        """Delete up to ``max_rows`` idle rows now (the decide function also does this on
        its own, now and then); 0 when another instance holds the sweep."""
        if not self.shell.ready:
            await self.shell.ensure()
        row = await self.shell.execute(self.planner.sweep_sql, (max_rows,), "a sweep")
        return int(row[0])

    async def migrate(self) -> None:
        """Install or update the schema, table and functions (idempotent; concurrent
        callers wait on one advisory lock, so one of them does the work)."""
        await self.shell.migrate()

    async def aclose(self) -> None:
        """Answer every op queued or in flight, then close the pool."""
        self.shell.closing = True
        await self._coalescer.drain()
        await self.shell.close()

    async def __aenter__(self) -> AsyncPostgresStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
