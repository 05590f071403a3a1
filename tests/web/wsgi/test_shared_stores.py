"""Flask under gunicorn with TWO workers, and Starlette under TWO uvicorn processes, sharing
Redis or PostgreSQL: the partner scenario.

Each worker is its own process with its own limiter; only the store is shared. Every
response carries ``X-Worker`` (the pid that answered), so the test sees both workers
decide, and across every burst exactly one request per key is admitted.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from web.wsgi.appserver import AppServer
from web.wsgi.checks import OPTIONS, assert_denied, burst, common_rules

BURSTS = 6
LOAD_SECONDS = 3.5
"""Just over one 3 s window: a second admission is due during the load."""


def partner_bursts(server: AppServer, suffix: str) -> None:
    """Bursts of 10 on fresh keys: exactly one 200 each, nine full 429s; both workers answered."""
    workers: set[str] = set()
    for _ in range(BURSTS):
        responses = burst(f"{server.url}/items/{uuid.uuid4().hex[:12]}")
        assert sorted(r.status_code for r in responses) == [200] + [429] * 9
        for r in responses:
            workers.add(r.headers["X-Worker"])
            if r.status_code == 429:
                assert_denied(r, f"items{suffix}", 1, 3)
    assert len(workers) == 2, workers


async def _hammer(url: str, seconds: float, concurrency: int = 8) -> tuple[int, int, float]:
    """Requests to ``url`` from ``concurrency`` clients for ``seconds``: (admitted, denied, elapsed)."""
    counts = {200: 0, 429: 0}
    start = time.monotonic()
    deadline = start + seconds

    async def client() -> None:
        async with httpx.AsyncClient(timeout=20.0) as http:
            while time.monotonic() < deadline:
                status = (await http.get(url)).status_code
                counts[status] += 1  # any other status: KeyError, the test fails

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return counts[200], counts[429], time.monotonic() - start


def sustained_load(server: AppServer) -> None:
    """One key under load for a few seconds: admitted never exceeds 1 + elapsed // 3 (GCRA 1/3s)."""
    admitted, denied, elapsed = asyncio.run(_hammer(f"{server.url}/items/{uuid.uuid4().hex[:12]}", LOAD_SECONDS))
    assert 1 <= admitted <= 1 + int(elapsed // 3), (admitted, denied, elapsed)
    assert denied > 10 * admitted


def flask_on(store: str, suffix: str, tmp_path: Path) -> AppServer:
    config = {"store": store, "rules": common_rules(suffix, router=False), "options": OPTIONS}
    return AppServer("web.wsgi.flask_app:app", config, tmp_path, workers=2, name="flask-2w")


def starlette_on(store: str, suffix: str, tmp_path: Path) -> AppServer:
    config = {"store": store, "rules": common_rules(suffix), "options": OPTIONS}
    return AppServer("web.wsgi.starlette_app:app", config, tmp_path, kind="uvicorn", workers=2, name="uvicorn-2p")


REDIS = "redis://127.0.0.1:6379/0"
POSTGRES = "postgresql://127.0.0.1:5432/test"


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A schema of its own for this test, dropped afterwards."""
    schema = f"rk_wsgi_{uuid.uuid4().hex[:10]}"
    yield schema
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.parametrize(
    ("server_on", "store"),
    [
        pytest.param(starlette_on, "redis", id="two_uvicorn_processes_on_redis", marks=pytest.mark.redis),
        pytest.param(starlette_on, "postgres", id="two_uvicorn_processes_on_postgres", marks=pytest.mark.postgres),
        pytest.param(flask_on, "redis", id="two_workers_on_redis", marks=pytest.mark.redis),
        pytest.param(flask_on, "postgres", id="two_workers_on_postgres", marks=pytest.mark.postgres),
    ],
)
def test_processes_sharing_a_store(
    server_on: Callable[[str, str, Path], AppServer], store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = REDIS if store == "redis" else f"{POSTGRES}?schema={request.getfixturevalue('pg_schema')}"
    suffix = f".{uuid.uuid4().hex[:8]}"
    with server_on(url, suffix, tmp_path) as server:
        partner_bursts(server, suffix)
        sustained_load(server)
