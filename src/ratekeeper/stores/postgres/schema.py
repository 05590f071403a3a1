"""The SQL the PostgreSQL store installs: the schema, the state table and the PL/pgSQL
functions (``sql/*.sql``, shipped as package data), and the marker naming their version."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.stores.postgres.options import identifier

__all__ = ["ALGORITHM_FILES", "marker", "migration_sql"]

ALGORITHM_FILES = tuple(ALGORITHMS)
"""One script (SQL file) per algorithm of the registry, named after it, in its order."""


def _sql_file(name: str) -> str:
    return resources.files("ratekeeper.stores.postgres").joinpath("sql", f"{name}.sql").read_text(encoding="utf-8")


@cache
def _template() -> tuple[str, str]:
    """The SQL files in the order they must run, and the marker naming their version."""
    sql = resources.files("ratekeeper.stores.postgres").joinpath("sql")
    names = [
        "schema",
        *(name for name in ALGORITHM_FILES if sql.joinpath(f"{name}.sql").is_file()),
        "decide",
        "decide_single",
    ]
    body = "\n".join(_sql_file(name) for name in names)
    return body, "ratekeeper " + hashlib.blake2b(body.encode(), digest_size=8).hexdigest()


def migration_sql(schema: str = "ratekeeper", table: str = "state", unlogged: bool = False) -> str:
    """The SQL that creates (or updates) the schema, table and functions; idempotent.

    The decide function's comment records a digest of the files (not of the names, nor of
    the UNLOGGED choice, which applies only when the table is created), so a store can
    tell whether the installed functions are the ones it ships.
    """
    identifier("schema", schema)
    identifier("table", table)
    body, marker = _template()
    text = body.replace("@schema@", schema).replace("@table@", table)
    text = text.replace("@unlogged@", "UNLOGGED" if unlogged else "")
    return f"{text}\nCOMMENT ON FUNCTION {schema}.{table}_decide(text[], text) IS '{marker}';\n"


def marker() -> str:
    """The version of the functions this package ships (recorded on the installed decide function)."""
    return _template()[1]
