"""``AsyncPostgresStore``: the asyncio twin of ``PostgresStore``, over ``postgres_core``.

The same statements, options and decisions as the sync store (``AsyncPostgresCalls``,
``postgres_calls_async.py``, the source the sync calls are generated from); psycopg's
``AsyncConnectionPool`` (opened on first use, inside the running loop). Calls coalesce as
in the sync store (``Batch``: at most ``max_in_flight`` statements, one per row), and a
``call_later`` deadline severs a statement the server does not answer in time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.stores import wire
from ratekeeper.stores.postgres_calls_async import AsyncPostgresCalls
from ratekeeper.stores.postgres_core import Batch, sever

if TYPE_CHECKING:
    from ratekeeper.decision import Decision

__all__ = ["AsyncPostgresStore"]


class AsyncPostgresStore(AsyncPostgresCalls):
    """The asyncio PostgreSQL store (``postgresql://``, ``postgres://``); see ``PostgresOptions``."""

    def __init__(self, url: str = "postgresql://postgres@127.0.0.1:5432/postgres", **options: Any) -> None:
        super().__init__(url, **options)
        self.pool: Any = None
        self._schema_lock: asyncio.Lock | None = None
        self._batch: Batch[asyncio.Future[Decision | None]] = Batch(self.core.options.max_in_flight)
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    # -- what differs from the blocking store --------------------------------------------

    async def _pool(self) -> Any:
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

    def _arm(self, conn: Any, seconds: float) -> tuple[asyncio.TimerHandle, list[bool]]:
        """The client-side deadline: sever ``conn`` if its reply has not come in ``seconds``
        (a paused server answers nothing, and no ``statement_timeout`` can end that)."""
        fired: list[bool] = []

        def fire() -> None:
            fired.append(True)
            sever(conn)

        return asyncio.get_running_loop().call_later(seconds, fire), fired

    def _disarm(self, deadline: tuple[asyncio.TimerHandle, list[bool]]) -> bool:
        deadline[0].cancel()
        return bool(deadline[1])

    def _ready_lock(self) -> asyncio.Lock:
        if self._schema_lock is None:
            self._schema_lock = asyncio.Lock()
        return self._schema_lock

    async def _exec_prepared(self, conn: Any, name: bytes, params: Sequence[str]) -> Any:
        """Send the prepared statement ``name`` and wait for its text reply on the loop
        (psycopg's own generator, without a cursor)."""
        from psycopg.generators import execute

        pgconn = conn.pgconn
        encoding = conn.info.encoding
        pgconn.send_query_prepared(name, [p.encode(encoding) for p in params])
        results = await conn.wait(execute(pgconn))
        return self._prepared_reply(conn, results[-1])

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

    async def aclose(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        if self.pool is not None:
            await self._return_kept()
            await self.pool.close()
