"""What the asyncio PostgreSQL store does its own way (``driver_threads.py`` is the blocking
store's): the client-side deadline is a timer on the loop, a prepared statement's reply is
awaited on the loop, calls wait their turn as futures (``AsyncCoalescer``), and the pool
opens on first use, inside the running loop (psycopg's async pool and connections belong
to one loop). ``shell_async.py`` and ``store_async.py`` import these names; their generated
twins import the same names from ``driver_threads.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.stores.coalescing_asyncio import AsyncCoalescer
from ratekeeper.stores.postgres.errors import applied_nothing, store_down
from ratekeeper.stores.postgres.planner import queue
from ratekeeper.stores.postgres.sockets import sever

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.stores import wire
    from ratekeeper.stores.postgres.options import PostgresOptions

__all__ = ["POOL_NAME", "Deadlines", "Lock", "coalescer", "exec_prepared", "started"]

POOL_NAME = "ratekeeper-async"
Lock = asyncio.Lock


class Deadlines:
    """The client-side deadline of each statement: a ``call_later`` on the loop severs its
    connection if the reply has not come in time (a paused server answers nothing, and no
    ``statement_timeout`` can end that)."""

    def __init__(self, timeout: float) -> None:
        del timeout  # a timer per statement: no tick to size

    @staticmethod
    def arm(conn: Any, seconds: float) -> tuple[asyncio.TimerHandle, list[bool]]:
        fired: list[bool] = []

        def fire() -> None:
            fired.append(True)
            sever(conn)

        return asyncio.get_running_loop().call_later(seconds, fire), fired

    @staticmethod
    def disarm(deadline: tuple[asyncio.TimerHandle, list[bool]]) -> bool:
        """Stop it; whether it had passed (the connection was severed)."""
        deadline[0].cancel()
        return bool(deadline[1])

    def close(self) -> None:
        """Nothing outlives the statements."""


async def exec_prepared(conn: Any, name: bytes, params: Sequence[str]) -> Any:
    """Send the prepared statement ``name`` and wait for its text reply on the loop
    (psycopg's own generator, without a cursor): its last result."""
    from psycopg.generators import execute

    pgconn = conn.pgconn
    encoding = conn.info.encoding
    pgconn.send_query_prepared(name, [p.encode(encoding) for p in params])
    results = await conn.wait(execute(pgconn))
    return results[-1]


def coalescer(
    run: Callable[[Sequence[wire.Op], int | None], Awaitable[Sequence[Decision | bool]]], options: PostgresOptions
) -> AsyncCoalescer[wire.Op, Decision | bool]:
    """How concurrent tasks wait their turn in ``queue``: as futures on the loop."""
    return AsyncCoalescer(
        queue(options),
        run,
        store_down,
        options.timeout,
        "PostgreSQL",
        "this AsyncPostgresStore (AsyncLimiter) was first used on another event loop; psycopg's async "
        "pool and connections belong to one loop: open one store per event loop (e.g. inside asyncio.run)",
        applied_nothing,
    )


def started(store: Any) -> None:
    """Nothing to start: the pool opens on first use, inside the running loop."""
