"""Fixtures of the PostgreSQL store tests: each test gets its own schema, dropped after it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from ratekeeper.stores.postgres.store import PostgresStore

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def schema() -> Iterator[str]:
    """A schema name unique to this test; the schema (if created) is dropped afterwards."""
    name = f"rk_test_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(name)


@pytest.fixture
def pg_url(schema: str) -> str:
    return f"{PG_URL}?schema={schema}"


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    s = PostgresStore(pg_url)
    yield s
    s.close()
