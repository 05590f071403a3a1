"""The partner-portal demo end to end (examples/partner_portal/run.py --short), as a user runs it.

Two real uvicorn instances of the items service share the real PostgreSQL (or Redis); the
demo drives the rising load at both at once and writes summary.json and chart.png. What the
partner team needs to see: no user admitted above one per 2 s, every user that asked for more
admitted exactly its bound, no request failed, PostgreSQL's deadlock counter did not move and
no lock wait of the run's connections lasted as long as deadlock_timeout; and the run leaves
nothing in the store.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

RUN = Path(__file__).resolve().parents[2] / "examples" / "partner_portal" / "run.py"
PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"


def run_demo(store: str, out: Path) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, str(RUN), "--short", "--store", store, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary, done.stdout


def check_admissions(summary: dict[str, Any], out: Path) -> None:
    users = summary["users"]
    assert len(users) == 3
    for user, row in users.items():
        assert row["admitted"] <= row["bound"], (user, row)
        assert row["sent"] > row["bound"], (user, row)  # the short ramp asks for far more than the bound
        assert row["admitted"] == row["bound"], (user, row)
        assert row["errors"] == 0, (user, row)
        assert row["admitted"] + row["denied"] == row["sent"]
    total = summary["total"]
    assert total["admitted"] == sum(row["bound"] for row in users.values())
    assert total["errors"] == 0 and total["floor_errors"] == 0
    assert total["floor_sent"] > 0
    assert summary["problems"] == []
    for part in ("limited_admitted", "limited_refused", "floor_unlimited"):
        assert summary["latency"][part]["p99_ms"] > 0
    chart = (out / "chart.png").read_bytes()
    assert chart[:8] == b"\x89PNG\r\n\x1a\n" and len(chart) > 10_000


@pytest.mark.postgres
def test_short_demo_on_postgres(tmp_path: Path) -> None:
    import psycopg

    summary, stdout = run_demo("postgres", tmp_path)
    check_admissions(summary, tmp_path)
    pg = summary["postgres"]
    assert pg["errors"] == []
    assert pg["lock_samples"] > 20  # the sampler really ran through the load (every 50 ms)
    assert pg["deadlocks_moved"] == 0
    # the two instances may wait on one user's row for each other, for one statement at most:
    # never as long as deadlock_timeout, the wait PostgreSQL would log and check for a deadlock
    assert pg["lock_waits_reaching_deadlock_timeout"] is False
    assert pg["longest_lock_wait_ms"] < pg["deadlock_timeout_ms"]
    assert "VERDICT: ok" in stdout and "deadlocks" in stdout
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as conn:
        left = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (summary["run_id"],)).fetchone()
    assert left == (0,)  # the run's schema was dropped


@pytest.mark.redis
def test_short_demo_on_redis(tmp_path: Path) -> None:
    import redis

    summary, stdout = run_demo("redis", tmp_path)
    check_admissions(summary, tmp_path)
    assert summary["postgres"] is None
    assert "VERDICT: ok" in stdout
    client = redis.Redis.from_url(REDIS_URL)
    try:
        assert list(client.scan_iter(match=f"{summary['run_id']}:*")) == []  # the run's keys were deleted
    finally:
        client.close()
