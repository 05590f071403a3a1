"""``AsyncPostgresStore``: the asyncio twin of ``PostgresStore``, over ``postgres_core``.

The same statements, options and decisions as the sync store; psycopg's
``AsyncConnectionPool`` (opened on first use, inside the running loop). Calls coalesce as
in the sync store (``Batch``: at most ``max_in_flight`` statements, one per row), and a
``call_later`` deadline severs a statement the server does not answer in time.
"""

from __future__ import annotations

import asyncio
import contextlib
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

__all__ = ["AsyncPostgresStore"]


class AsyncPostgresStore:
    """The asyncio PostgreSQL store (``postgresql://``, ``postgres://``); see ``PostgresOptions``."""

    def __init__(self, url: str = "postgresql://postgres@127.0.0.1:5432/postgres", **options: Any) -> None:
        self.core = PostgresCore(url, **options)
        self.pool: Any = None
        self._ready = False
        self._ready_lock: asyncio.Lock | None = None
        self._batch: Batch[asyncio.Future[Decision | None]] = Batch(self.core.options.max_in_flight)
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._warm: weakref.WeakSet[Any] = weakref.WeakSet()

    async def _configure(self, conn: Any) -> None:
        await conn.execute(self.core.session_sql)

    async def _open(self) -> Any:
        if self.pool is None:
            from psycopg_pool import AsyncConnectionPool

            opts = self.core.options
            pool = AsyncConnectionPool(
                opts.conninfo,
                kwargs=opts.connection_kwargs(),
                min_size=opts.min_size,
                max_size=opts.max_size,
                configure=self._configure,
                timeout=opts.timeout,
                reconnect_timeout=max(60.0, opts.timeout),
                name="ratekeeper-async",
                open=False,
            )
            await pool.open(wait=False)
            self.pool = pool
        return self.pool

    # -- executing statements ------------------------------------------------------------

    async def _execute(self, sql: str, params: Sequence[Any], what: str) -> Any:
        import psycopg
        import psycopg_pool

        pool = self.pool if self.pool is not None else await self._open()
        fired: list[bool] = []
        try:
            async with pool.connection(timeout=self.core.timeout) as conn:
                watchdog = self._arm(conn, self.core.timeout, fired)
                try:
                    if self._ready and conn not in self._warm:
                        await self._warm_up(conn)
                    cur = await conn.execute(sql, params, binary=True)  # binary replies: far cheaper to read
                    return await cur.fetchone() if cur.description is not None else None
                finally:
                    watchdog.cancel()
                    if fired:
                        await conn.close()  # severed: the pool must not hand it out again
        except (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
            if fired:
                raise StoreTimeout(f"PostgreSQL did not answer {what} in time (the connection was dropped)") from exc
            if connection_lost(exc):
                await self._check_pool()
            raise translate(exc, what) from exc

    @staticmethod
    def _arm(conn: Any, seconds: float, fired: list[bool]) -> asyncio.TimerHandle:
        """The client-side deadline: sever ``conn`` if its reply has not come in ``seconds``
        (a paused server answers nothing, and no ``statement_timeout`` can end that)."""

        def fire() -> None:
            fired.append(True)
            sever(conn)

        return asyncio.get_running_loop().call_later(seconds, fire)

    async def _warm_up(self, conn: Any) -> None:
        """Compile the functions in this new session before it locks any row."""
        import psycopg

        try:
            async with conn.transaction(force_rollback=True):  # compiled and planned; nothing kept
                await conn.execute(*self.core.warm_up())
        except psycopg.errors.UndefinedFunction:
            return  # not installed yet: the next call warms it
        self._warm.add(conn)

    async def _check_pool(self) -> None:
        """A connection died: replace the idle ones that died with it (a server restart)."""
        with contextlib.suppress(Exception):  # the pool reconnects in the background anyway
            await self.pool.check()

    async def migrate(self) -> None:
        """Install or update the schema, table and functions (idempotent, one advisory lock)."""
        import psycopg
        import psycopg_pool

        core = self.core
        pool = await self._open()
        fired: list[bool] = []
        try:
            async with pool.connection(timeout=core.timeout) as conn:
                watchdog = self._arm(conn, core.migrate_timeout, fired)
                try:
                    async with conn.transaction():
                        await conn.execute("SET LOCAL statement_timeout = 0")  # the deadline is the watchdog's
                        await conn.execute(core.lock_sql, core.lock_params)
                        cur = await conn.execute(core.installed_sql, core.installed_params)
                        if not core.is_current(await cur.fetchone()):
                            await conn.execute(core.migration(), prepare=False)
                finally:
                    watchdog.cancel()
                    if fired:
                        await conn.close()
        except (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
            if fired:
                raise StoreTimeout(f"the schema migration took longer than {core.migrate_timeout}s") from exc
            raise translate(exc, "the schema migration") from exc
        self._ready = True

    async def _ensure(self) -> None:
        if self._ready_lock is None:
            self._ready_lock = asyncio.Lock()
        async with self._ready_lock:
            if self._ready:
                return
            row = await self._execute(self.core.installed_sql, self.core.installed_params, "the schema check")
            if self.core.is_current(row):
                self._ready = True
            else:
                await self.migrate()

    async def _run(self, ops: Sequence[wire.Op], now: int | None, atomic: bool = False) -> list[Decision | None]:
        if not self._ready:
            await self._ensure()
        sql, params = self.core.call(ops, now, atomic)
        return self.core.decode(ops, await self._execute(sql, params, "a decision"))

    async def _submit(self, op: wire.Op, now: int | None) -> Decision | None:
        if not self.core.options.batching:
            return (await self._run([op], now))[0]
        future: asyncio.Future[Decision | None] = asyncio.get_running_loop().create_future()
        self._batch.queue.append((op, now, future))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        """Send what is queued, as far as ``max_in_flight`` and the busy rows allow."""
        self._scheduled = False
        while (nxt := self._batch.take()) is not None:
            ops, now, futures = nxt
            task = asyncio.ensure_future(self._call(ops, now, futures))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, ops: list[wire.Op], now: int | None, futures: list[asyncio.Future[Decision | None]]) -> None:
        try:
            results = await self._run(ops, now)
        except BaseException as exc:
            for f in futures:
                if not f.done():
                    f.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for f, result in zip(futures, results, strict=True):
                if not f.done():
                    f.set_result(result)
        finally:
            self._batch.finish(ops)
            if self._batch.queue and not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)

    # -- the AsyncStore role -------------------------------------------------------------

    async def decide(
        self,
        plan: Plan,
        key: str,
        cost: int,
        max_wait: int | None = None,
        lease_id: str | None = None,
        now: int | None = None,
        commit: bool = True,
    ) -> Decision:
        decision = await self._submit((wire.DECIDE if commit else wire.PEEK, plan, key, cost, max_wait, lease_id), now)
        assert decision is not None
        return decision

    async def decide_ops(
        self, ops: Sequence[wire.Op], now: int | None = None, atomic: bool = False
    ) -> list[Decision | None]:
        """Decide a list of wire ops in one statement, in order (None for each refund)."""
        return await self._run(ops, now, atomic)

    async def decide_many(self, items: Sequence[Item], now: int | None = None) -> tuple[Decision, ...]:
        decisions = await self._run(self.core.many_ops(items), now, atomic=True)
        return tuple(d for d in decisions if d is not None)

    async def refund(
        self, plan: Plan, key: str, cost: int, lease_id: str | None = None, now: int | None = None
    ) -> None:
        await self._submit((wire.REFUND, plan, key, cost, None, lease_id), now)

    async def reset(self, plan: Plan, key: str) -> None:
        if not self._ready:
            await self._ensure()
        sql, params = self.core.reset(plan, key)
        await self._execute(sql, params, "a reset")

    async def sweep(self, max_rows: int = 1000) -> int:
        """Delete up to ``max_rows`` idle rows now; 0 when another instance holds the sweep."""
        if not self._ready:
            await self._ensure()
        row = await self._execute(self.core.sweep_sql, (max_rows,), "a sweep")
        return int(row[0])

    async def aclose(self) -> None:
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        if self.pool is not None:
            await self.pool.close()
