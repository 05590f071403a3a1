"""The PostgreSQL store: one statement (one PL/pgSQL function call) per decision.

A request's path: ``store_async`` (``AsyncPostgresStore``; ``store`` is its generated
blocking twin, ``PostgresStore``) asks ``planner`` (``PostgresPlanner``, no I/O) for the
statement of its ops, hands it to ``shell_async`` / ``shell`` (the pool, the kept
connection, prepared statements, the deadline, the migration), and has the planner read
the reply. Around them: ``options`` (the URL), ``schema`` and ``sql/`` (the SQL installed,
shipped as package data), ``errors`` (psycopg's exceptions, named), ``sockets``, and
``driver_asyncio`` / ``driver_threads`` (what asyncio and threads must do differently).

psycopg is imported only when a store is opened (the ``postgres`` extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratekeeper.stores.postgres.store import PostgresStore
    from ratekeeper.stores.postgres.store_async import AsyncPostgresStore

__all__ = ["AsyncPostgresStore", "PostgresStore"]


def __getattr__(name: str) -> Any:
    # The stores load their coalescing drivers: imported when asked for, not with the package.
    if name == "PostgresStore":
        from ratekeeper.stores.postgres.store import PostgresStore

        return PostgresStore
    if name == "AsyncPostgresStore":
        from ratekeeper.stores.postgres.store_async import AsyncPostgresStore

        return AsyncPostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
