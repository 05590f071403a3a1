"""Fixtures of the web tests: rules built in code, and the stores a real server runs on.

``store_url`` is parametrised over memory, the Redis on 127.0.0.1:6379 and the
PostgreSQL on 127.0.0.1:5432 (a schema of this run, dropped at the end). Tests keep
their state apart by a rule name unique to the test (``rule_name``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from ratekeeper import Rule
from ratekeeper.config.model import CLIENT_ADDRESS_KEY, HttpRule, KeyTemplate, Match, PathTemplate

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
RUN = uuid.uuid4().hex[:10]


def http_rule(
    name: str,
    limits: str | list[str],
    *,
    path: str | None = None,
    methods: tuple[str, ...] = (),
    key: str | None = None,
    cost: int | str = 1,
    shadow: bool = False,
    algorithm: str = "gcra",
    on_error: str | None = None,
) -> HttpRule:
    """An ``HttpRule`` as a rules file would give it: without ``key``, keyed by the
    client's address; ``key="*"``: one global key."""
    match = Match(frozenset(m.upper() for m in methods), (PathTemplate.parse(path),) if path else ())
    return HttpRule(
        Rule(name, limits, algorithm, on_error=on_error),
        match,
        CLIENT_ADDRESS_KEY if key is None else KeyTemplate.parse(key),
        KeyTemplate.parse(cost) if isinstance(cost, str) else cost,
        shadow,
    )


@pytest.fixture
def rule_name() -> str:
    """A rule name unique to this test: its state never meets another test's."""
    return f"web.{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def pg_schema() -> Iterator[str]:
    name = f"rk_web_{RUN}"
    yield name
    try:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    except Exception:  # noqa: BLE001 - the server may be down; the tests that needed it said so
        pass


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def store_url(request: pytest.FixtureRequest) -> str:
    """The URL of each store a middleware may run on."""
    if request.param == "memory":
        return "memory://"
    if request.param == "redis":
        return "redis://127.0.0.1:6379/0"
    schema: str = request.getfixturevalue("pg_schema")
    return f"{PG_URL}?schema={schema}"
