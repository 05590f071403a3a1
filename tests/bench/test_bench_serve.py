"""``ratekeeper bench serve`` starts the real service on memory and Redis, loads it with wrk,
h2load and its grpcio client, and prints tables with numbers; every case answers what its
name says, and the run leaves no Redis key behind."""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import re
import shutil
import uuid

import pytest
import redis as redis_py

from ratekeeper.cli import build_parser
from ratekeeper_bench import serve
from ratekeeper_bench.serve_client import percentile

pytestmark = pytest.mark.slow  # a benchmark run

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="module")
def tools_installed() -> None:
    missing = [tool for tool, package in (("wrk", "wrk"), ("h2load", "nghttp2-client")) if shutil.which(tool) is None]
    if missing:
        reason = f"{', '.join(missing)} not installed (apt-get install wrk nghttp2-client)"
        if os.environ.get("RATEKEEPER_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason}; RATEKEEPER_REQUIRE_SERVICES=1 forbids skipping it")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def quick(tools_installed: None) -> tuple[serve.ServeBenchResult, str, str]:
    """One quick run on both stores: the result, the Markdown it printed, its progress lines."""
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    # A store call of the service may wait its turn behind the other test workers on a
    # loaded machine: a generous timeout, so a slow call is measured, not failed.
    redis_url = f"{REDIS_URL}?timeout=5"
    settings = serve.settings_from_args(parser.parse_args(["--quick", "--redis-url", redis_url]))
    settings = dataclasses.replace(settings, prefix=f"rk-test-bench-serve-{uuid.uuid4().hex[:12]}:")
    out, err = io.StringIO(), io.StringIO()
    result = serve.run_serve_bench(settings, out, True, err)
    return result, out.getvalue(), err.getvalue()


@pytest.mark.redis
def test_quick_run_measures_every_case_on_both_stores(quick: tuple[serve.ServeBenchResult, str, str]) -> None:
    result, _, _ = quick
    assert result.failures == []
    assert result.skipped == []
    expected = [(store, kind) for store in serve.STORES for kind in serve.KINDS]
    assert [(r.case.store, r.case.kind.name) for r in result.results] == expected
    for r in result.results:
        load = r.median.load
        assert len(r.rounds) == 1
        assert load.errors == 0, r.case
        assert r.median.load_cpu > 0, r.case
        if load.requests:
            assert 0 < load.p50_us <= load.p99_us <= load.max_us, r.case
            assert r.median.server_cpu > 0, r.case
    # The machine and its Redis are shared with other benchmarks pinned to the same CPUs: a
    # 1 s round may fall in a stall longer than itself and count nothing (the report then
    # shows 0). Most rounds must measure something, and /v1/check on memory always.
    measured = [r for r in result.results if r.median.load.requests > 0]
    assert len(measured) >= 0.75 * len(result.results), [r.case.label for r in result.results if r not in measured]
    check = result.result("check", "memory")
    assert check is not None and check.median.load.requests > 0


@pytest.mark.redis
def test_allowed_cases_are_never_refused_and_spent_ones_always(
    quick: tuple[serve.ServeBenchResult, str, str],
) -> None:
    result, _, _ = quick
    for store in serve.STORES:
        for kind in ("healthz", "check", "batch", "grpc_keys"):
            r = result.result(kind, store)
            assert r is not None and r.median.load.refused == 0, (store, kind)
        denied = result.result("check_denied", store)
        assert denied is not None
        load = denied.median.load
        # Every answer is a 429 (counted status by status by wrk's Lua hook), or, on Redis, a
        # store failure (a 503, counted apart) when the shared Redis is too slow to answer.
        assert load.refused + load.failed == load.requests, result.service_logs
    for r in result.results:
        if r.case.store == "memory":
            assert r.median.load.failed == 0, r.case
    for store in serve.STORES:
        batch = result.result("batch", store)
        assert batch is not None and batch.decision_rate == pytest.approx(batch.rate * serve.BATCH)
    memory_denied = result.result("check_denied", "memory")
    assert memory_denied is not None and memory_denied.median.load.statuses == (
        (429, memory_denied.median.load.requests),
    )


@pytest.mark.redis
def test_paced_runs_hold_half_the_peak_rate(quick: tuple[serve.ServeBenchResult, str, str]) -> None:
    result, _, _ = quick
    ran = {(p.store, p.what) for p in result.paced}
    assert {("memory", what) for what in serve.PACED} <= ran
    redis_check = result.result("check", "redis")
    if redis_check is not None and redis_check.rate > 0:  # see the stalled-Redis note above
        assert {("redis", "http"), ("redis", "healthz")} <= ran
    for p in result.paced:
        assert p.load.rate_asked == pytest.approx(p.peak / 2, rel=0.01)
        assert p.load.errors == 0
        # Every call due in the window was sent and answered (the client never drops a call).
        assert p.load.requests == int(p.load.rate_asked * result.settings.duration)
        assert 0 < p.load.p50_us <= p.load.p99_us <= p.load.max_us


@pytest.mark.redis
def test_report_has_numbers_in_every_table_and_a_verdict_per_target(
    quick: tuple[serve.ServeBenchResult, str, str],
) -> None:
    result, markdown, progress = quick
    assert markdown.startswith("## The service (`ratekeeper bench serve`)")
    sections = dict(part.split("\n", 1) for part in markdown.split("\n### ")[1:])
    peak_rows = re.findall(r"^\| (memory|redis) \| [^|]+ \| ([\d,]+) \|", sections["Peak"], re.M)
    assert len(peak_rows) == len(serve.STORES) * len(serve.KINDS)
    assert sum(int(rate.replace(",", "")) > 0 for _, rate in peak_rows) >= 0.75 * len(peak_rows)
    paced = sections["Latency at half the peak rate"]
    paced_rows = re.findall(r"^\| (memory|redis) \| [^|]+ \| [\d,]+ \| [\d,]+ \| ([\d,]+) \| ([\d.]+) \|", paced, re.M)
    assert len(paced_rows) == len(result.paced)
    assert all(
        int(rate.replace(",", "")) > 0 and float(p50) > 0 for store, rate, p50 in paced_rows if store == "memory"
    )
    targets = re.findall(r"^\| [^|]+ \| [≥≤<] [^|]+ \| [^|]+ \| (met|\*\*not met\*\*) \|", markdown, re.M)
    assert len(targets) == len(result.targets()) == 5
    assert "pinned to CPU 0" in markdown if result.pinned else "no pinning" in markdown
    assert len(progress.strip().splitlines()) == len(serve.STORES) * (len(serve.KINDS) + len(serve.PACED))


@pytest.mark.redis
def test_the_run_leaves_no_redis_key(quick: tuple[serve.ServeBenchResult, str, str]) -> None:
    result, _, _ = quick
    assert result.redis_keys_deleted > 0  # the redis cases wrote under the run's prefix...
    client = redis_py.Redis.from_url(REDIS_URL)
    try:  # ...and nothing is left there
        assert list(client.scan_iter(match=result.settings.prefix + "*", count=1000)) == []
    finally:
        client.close()


def test_the_cli_runs_bench_serve() -> None:
    args = build_parser().parse_args(["bench", "serve", "--quick", "--store", "memory", "--no-pin"])
    assert args.bench_run is serve.run
    settings = serve.settings_from_args(args)
    assert (settings.duration, settings.rounds, settings.stores, settings.pin) == (1, 1, ("memory",), False)


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) == 0.0
