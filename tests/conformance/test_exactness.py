"""Exactness under real concurrency: many processes hammering one key admit exactly the limit.

8 processes x 4 threads (or 4 asyncio tasks) try 8 times each to take one unit from ONE
key, for each exact algorithm in turn: 256 attempts against a limit of 50 that nothing
frees during the test (see ``exactness_worker.CASES``), then a ``try_acquire_many`` of a
30/day and a 50/day rule on that key. Every process starts each case at a shared barrier.
The store must admit exactly 50 (30 batches): never more (no lost update between processes
or within a coalesced call), never fewer while demand exceeds it (no decision lost or
double-counted). Modes: "sync" and "async" spawn processes that each open their own
limiter; "fork" forks children that share the parent's ``Limiter``, opened and used before
the fork (a web server preloading its app). Runs on the shared Redis, a private Redis
Cluster and the shared PostgreSQL.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from conformance.exactness_worker import BATCH, BATCH_LIMIT, LIMIT, NAMES, case_rules, hammer
from conformance.harness import POSTGRES_URL, REDIS_URL, delete_redis_keys, drop_schema
from ratekeeper import Limiter, Rule

PROCESSES = 8
WORKERS = 4
ATTEMPTS = 8
RESULT_TIMEOUT = 30.0
"""Each run takes a few seconds even on a loaded machine; a process silent this long hangs."""

FIXED_WINDOW_US = 3650 * 86_400_000_000
STORE_TIMEOUT = 10.0
"""The stores' call timeout here: 32 threads in 8 processes on a loaded machine may queue a
call longer than the default, and this test counts admissions, not latency."""


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, Any]]]:
    """(URL, store options) of a store of its own on one kind of server; removed afterwards."""
    unique = uuid.uuid4().hex[:12]
    cleanup: Callable[[], None]
    if request.param == "redis":
        prefix = f"rk-exactness-{unique}:"
        url, options, cleanup = REDIS_URL, {"prefix": prefix}, lambda: delete_redis_keys(prefix)
    elif request.param == "redis-cluster":
        url, options, cleanup = request.getfixturevalue("redis_cluster_url"), {"prefix": f"rk-x-{unique}:"}, _nothing
    else:
        schema = f"rk_exactness_{unique}"
        url, options, cleanup = POSTGRES_URL, {"schema": schema}, lambda: drop_schema(schema)
        _create_schema(url, options)
    options["timeout"] = STORE_TIMEOUT
    try:
        yield url, options
    finally:
        cleanup()


def _nothing() -> None:
    pass


def _create_schema(url: str, options: dict[str, Any]) -> None:
    """Create the store's schema before the processes start (as ``ratekeeper migrate`` would),
    so the test measures decisions, not eight processes racing to create one schema."""
    with Limiter(url, **options) as limiter:
        limiter.peek(Rule("exactness-setup", ["1/second"]), "setup")


@pytest.mark.parametrize("mode", ["sync", "async", "fork"])
def test_every_exact_algorithm_admits_exactly_its_limit_across_processes(
    server: tuple[str, dict[str, Any]], mode: str
) -> None:
    """8 processes x 4 threads (or tasks; or threads sharing the parent's Limiter after a
    fork) x 8 attempts on one key: exactly 50 admitted for
    each of fixed window, sliding log, token bucket, GCRA, leaky bucket and concurrency, and
    a batch of a 30/day and a 50/day rule admitted exactly 30 times (the 50/day rule charged
    by those 30 only)."""
    url, options = server
    window = time.time_ns() // 1000 // FIXED_WINDOW_US
    key = f"hot-{mode}"
    inherited = None
    if mode == "fork":  # one Limiter, used here, then shared by forked children (a preloading server)
        inherited = Limiter(url, **options)
        inherited.peek(case_rules(BATCH)[0], key)
    context = multiprocessing.get_context("fork" if mode == "fork" else "spawn")
    barrier = context.Barrier(PROCESSES)
    results: Any = context.Queue()
    args = (url, options, mode, key, WORKERS, ATTEMPTS, barrier, results, inherited)
    processes = [context.Process(target=hammer, args=args, daemon=True) for _ in range(PROCESSES)]
    try:
        for p in processes:
            p.start()
        reports = []
        deadline = time.monotonic() + RESULT_TIMEOUT
        for _ in processes:
            try:
                reports.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue_module.Empty:
                pytest.fail(f"only {len(reports)} of {PROCESSES} processes reported within {RESULT_TIMEOUT}s")
    finally:
        end = time.monotonic() + 5
        for p in processes:
            if p.pid is not None:
                p.join(timeout=max(0.0, end - time.monotonic()))
        for p in processes:
            if p.pid is not None and p.is_alive():
                p.kill()
                p.join(timeout=5)
        if inherited is not None:
            inherited.close()
    errors = [detail for status, detail in reports if status != "ok"]
    assert not errors, "a process failed:\n" + "\n".join(errors)
    assert window == time.time_ns() // 1000 // FIXED_WINDOW_US, "a fixed window boundary fell inside the test"
    failed = {
        algorithm: detail for _, counts in reports for algorithm, detail in counts.items() if isinstance(detail, str)
    }
    totals = {name: "error" if name in failed else sum(counts[name] for _, counts in reports) for name in NAMES}
    assert PROCESSES * WORKERS * ATTEMPTS > LIMIT  # demand exceeds the limit
    expected = {name: BATCH_LIMIT if name == BATCH else LIMIT for name in NAMES}
    assert totals == expected, f"admitted: {totals}\n" + "\n".join(
        f"{name} failed in a process:\n{detail}" for name, detail in failed.items()
    )
    with Limiter(url, **options) as limiter:  # the refused batches charged nothing
        assert limiter.peek(case_rules(BATCH)[1], f"hot-{mode}", 0).remaining == LIMIT - BATCH_LIMIT
