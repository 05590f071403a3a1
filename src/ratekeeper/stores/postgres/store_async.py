"""``AsyncPostgresStore``: the asyncio twin of ``PostgresStore``, over ``postgres_core``.

The same statements, options and decisions as the sync store (``AsyncPostgresCalls``,
``postgres_calls_async.py``, the source the sync calls are generated from); psycopg's
``AsyncConnectionPool`` (opened on first use, inside the running loop). Calls coalesce as
in the sync store (``AsyncCoalescer``, ``stores/coalescing.py``, with its guarantees: at
most ``max_in_flight`` statements, one per row), and a ``call_later`` deadline severs a
statement the server does not answer in time. A store belongs to the event loop it is
first used on (psycopg's async pool and connections cannot move between loops).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.stores import wire
from ratekeeper.stores.coalescing import Coalescer
from ratekeeper.stores.coalescing_asyncio import AsyncCoalescer
from ratekeeper.stores.postgres.calls_async import AsyncPostgresCalls
from ratekeeper.stores.postgres.sansio import MAX_BATCH, Connects, applied_nothing, row, sever, store_down

if TYPE_CHECKING:
    from ratekeeper.decision import Decision

__all__ = ["AsyncPostgresStore"]


class AsyncPostgresStore(AsyncPostgresCalls):
    """The asyncio PostgreSQL store (``postgresql://``, ``postgres://``); see ``PostgresOptions``."""

    def __init__(self, url: str = "postgresql://postgres@127.0.0.1:5432/postgres", **options: Any) -> None:
        super().__init__(url, **options)
        self.pool: Any = None
        self._schema_lock: asyncio.Lock | None = None
        opts = self.core.options
        self._coalescer: AsyncCoalescer[wire.Op, Decision | bool] = AsyncCoalescer(
            Coalescer(opts.max_in_flight, MAX_BATCH, row, one_call_per_row=True),
            self._run,
            store_down,
            opts.timeout,
            "PostgreSQL",
            "this AsyncPostgresStore (AsyncLimiter) was first used on another event loop; psycopg's async "
            "pool and connections belong to one loop: open one store per event loop (e.g. inside asyncio.run)",
            applied_nothing,
        )

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
                connection_class=_recording(self.connects),
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

    async def _submit(self, op: wire.Op, now: int | None) -> Decision | bool:
        if self.core.options.batching:
            return await self._coalescer.submit(op, now)
        self._coalescer.bind()  # psycopg's async pool belongs to one loop, batching or not
        return (await self._run([op], now))[0]

    async def aclose(self) -> None:
        """Answer every op queued or in flight, then close the pool."""
        self._closing = True
        await self._coalescer.drain()
        if self.pool is not None:
            await self._return_kept()
            await self.pool.close()


def _recording(connects: Connects) -> Any:
    """psycopg's ``AsyncConnection``, recording each attempt of the pool in ``connects``."""
    import psycopg

    class RecordingConnection(psycopg.AsyncConnection[Any]):
        @classmethod
        async def connect(cls, *args: Any, **kwargs: Any) -> Any:
            try:
                conn = await super().connect(*args, **kwargs)
            except BaseException as exc:
                connects.failed(exc)
                raise
            connects.succeeded()
            return conn

    return RecordingConnection
