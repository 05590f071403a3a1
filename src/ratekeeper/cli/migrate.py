"""``ratekeeper migrate``: create or update the PostgreSQL store's schema."""

from __future__ import annotations

import argparse

from ratekeeper.errors import RateKeeperError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "migrate",
        help="create or update a server store's schema (PostgreSQL)",
        description=(
            "Create the schema, the state table and the functions of the PostgreSQL store, or "
            "bring the functions up to date. Idempotent: running it again changes nothing. "
            "The store also does this on first use; run it ahead when the application's "
            "database user may not create objects."
        ),
        epilog="example: ratekeeper migrate --store 'postgresql://app@db/app?schema=ratekeeper&unlogged=true'",
    )
    p.add_argument("--store", required=True, help="store URL, e.g. postgresql://user@host:5432/dbname?schema=...")
    p.add_argument("--print", action="store_true", help="print the SQL instead of running it")


def run(args: argparse.Namespace) -> int:
    from urllib.parse import urlsplit

    from ratekeeper.stores.postgres.options import POSTGRES_SCHEMES, PostgresOptions
    from ratekeeper.stores.postgres.schema import migration_sql

    if urlsplit(args.store).scheme.lower() not in POSTGRES_SCHEMES:
        raise RateKeeperError(
            f"migrate applies to postgresql:// stores (the others need no schema), got {args.store!r}"
        )
    if args.print:
        opts = PostgresOptions(args.store)
        print(migration_sql(opts.schema, opts.table, opts.unlogged))
        return 0
    from ratekeeper.stores.postgres.store import PostgresStore

    store = PostgresStore(args.store)
    try:
        store.migrate()
    finally:
        store.close()
    opts = store.planner.options
    print(f"schema {opts.schema}, table {opts.schema}.{opts.table}: up to date")
    return 0
