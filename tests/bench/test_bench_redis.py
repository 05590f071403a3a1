"""``ratekeeper bench redis`` measures every library on the real Redis, in every scenario and
mode, next to the raw floor; the hammer counts admissions; the run leaves no key behind."""

from __future__ import annotations

import argparse
import io

import pytest
import redis as redis_py

from ratekeeper_bench import redis as bench
from ratekeeper_bench.latency import Sample, percentile, time_sync
from ratekeeper_bench.redis_peers import LIBRARIES, RATEKEEPER_ALGORITHMS, floor_subjects, subjects

pytestmark = pytest.mark.slow  # a benchmark run


def test_percentile_is_the_nearest_rank_in_microseconds() -> None:
    latencies = [1000 * i for i in range(1, 101)]  # 1..100 µs
    assert percentile(latencies, 0.50) == 51.0  # round(0.5 * 99) = 50: the 51st value
    assert percentile(latencies, 0.99) == 99.0
    assert percentile([], 0.99) == 0.0


def test_a_call_that_raises_is_an_error_not_a_decision() -> None:
    def decide(key: str) -> bool:
        if key == "bad":
            raise RuntimeError("store down")
        return key == "ok"

    sample = time_sync(decide, iter(["ok", "no", "bad"] * 1_000_000), 0.02)
    assert sample.errors > 0
    assert sample.first_error == "RuntimeError: store down"
    assert sample.allowed > 0
    assert sample.calls > sample.allowed  # "no" is a denial, counted as a decision


def test_rounds_report_the_median_round_with_every_rate() -> None:
    def cell(calls: int) -> bench.Cell:
        return bench.Cell("ratekeeper", "gcra", "hot_key", "sync", ("gcra",), Sample(calls, calls, 0, 1.0, 1.0, 1, 2))

    chosen = bench._median([cell(300), cell(100), cell(200)])
    assert chosen.rate == 200
    assert chosen.round_rates == (300, 100, 200)


@pytest.fixture(scope="module")
def tiny() -> bench.RedisBenchResult:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--quick", "--duration", "0.05", "--keys", "200", "--no-progress"])
    return bench.bench_from_args(args, io.StringIO())


def _subjects() -> set[tuple[str, str]]:
    return {(s.library, s.algorithm) for library in LIBRARIES for s in subjects(library)}


@pytest.mark.redis
def test_tiny_run_has_a_row_for_every_subject_scenario_and_mode(tiny: bench.RedisBenchResult) -> None:
    assert tiny.failures == []
    assert tiny.skipped == {}
    floors = {(s.library, s.algorithm) for s in floor_subjects()}
    expected = {
        (lib, algo, sc, mode) for lib, algo in _subjects() | floors for sc in bench.SCENARIOS for mode in bench.MODES
    }
    actual = [(c.library, c.algorithm, c.scenario, c.mode) for c in tiny.cells]
    assert expected == set(actual)
    assert len(expected) == len(actual)


@pytest.mark.redis
def test_every_cell_decided_without_errors_and_has_positive_rate_and_latencies(tiny: bench.RedisBenchResult) -> None:
    wrong = [
        (c.library, c.algorithm, c.scenario, c.mode)
        for c in tiny.cells
        if not (c.sample.calls > 0 and c.rate > 0 and 0 < c.sample.p50_us <= c.sample.p99_us and c.sample.errors == 0)
    ]
    assert wrong == []


@pytest.mark.redis
def test_the_limit_of_the_throughput_cells_admits_nearly_every_call(tiny: bench.RedisBenchResult) -> None:
    wrong = [(c.library, c.algorithm) for c in tiny.cells if c.sample.allowed < 0.9 * c.sample.calls]
    assert wrong == []


@pytest.mark.redis
def test_coalesced_and_uncoalesced_cells_both_ran(tiny: bench.RedisBenchResult) -> None:
    assert [c.algorithm for c in tiny.coalescing] == ["coalesced", "uncoalesced"]
    assert all(c.rate > 0 and c.sample.errors == 0 for c in tiny.coalescing)


@pytest.mark.redis
def test_the_hammer_ran_every_subject_and_ratekeeper_admits_exactly_the_limit(tiny: bench.RedisBenchResult) -> None:
    assert {(h.library, h.algorithm) for h in tiny.hammer} == _subjects()
    for ham in tiny.hammer:
        assert ham.attempts == 800
        assert ham.errors == 0, ham
        assert ham.admitted >= bench.HAMMER_SPEC.count  # demand exceeds the limit: nobody under-admits
    ours = {h.algorithm: h.admitted for h in tiny.hammer if h.library == "ratekeeper"}
    assert ours == dict.fromkeys(ours, bench.HAMMER_SPEC.count)


@pytest.mark.redis
def test_markdown_has_every_table(tiny: bench.RedisBenchResult) -> None:
    text = tiny.to_markdown()
    for header in (
        "### sync, one thread: `hot_key`",
        "### asyncio, 50 tasks: `many_keys`",
        "### Coalescing",
        "### The hammer",
    ):
        assert header in text
    assert "| redis-py | EVALSHA |" in text
    assert "| throttled-py | gcra |" in text


@pytest.mark.redis
def test_the_run_leaves_no_key_under_its_prefix(tiny: bench.RedisBenchResult) -> None:
    assert tiny.prefix.startswith("rkbench:")
    with redis_py.Redis.from_url(bench.DEFAULT_URL) as client:
        assert list(client.scan_iter(match=tiny.prefix + "*", count=1000)) == []


@pytest.mark.redis
def test_cleanup_deletes_only_keys_under_the_prefix(key_prefix: str) -> None:
    with redis_py.Redis.from_url(bench.DEFAULT_URL) as client:
        client.set(f"{key_prefix}:mine:a", 1)
        client.set(f"{key_prefix}:mine:b", 1)
        client.set(f"{key_prefix}:other", 1)
        try:
            assert bench.cleanup(bench.DEFAULT_URL, f"{key_prefix}:mine:") == 2
            assert client.exists(f"{key_prefix}:mine:a", f"{key_prefix}:mine:b", f"{key_prefix}:other") == 1
        finally:
            client.delete(f"{key_prefix}:other")


@pytest.mark.redis
def test_server_cost_has_every_algorithm_and_the_log_lengths_and_every_call_admitted(
    tiny: bench.RedisBenchResult,
) -> None:
    labels = [c.subject for c in tiny.costs]
    assert labels[0] == "redis-py `EVALSHA` of `return 1`"
    assert "sliding_window_log, two limits" in labels
    for length in bench.LOG_LENGTHS:
        assert f"sliding_window_log, {length:,} entries" in labels
    assert tiny.cost_server == "a private redis-server"
    wrong = [c for c in tiny.costs if not (c.calls > 0 and c.usec_per_call > 0 and c.errors == 0 and c.denied == 0)]
    assert wrong == []
    assert "### Redis CPU per decision, and the sliding log by length" in tiny.to_markdown()


@pytest.mark.redis
def test_the_asyncio_split_has_every_algorithm_in_both_scenarios_and_the_floors(tiny: bench.RedisBenchResult) -> None:
    cells = {(c.algorithm, c.scenario) for c in tiny.split}
    assert cells == {(a, s) for a in RATEKEEPER_ALGORITHMS for s in ("hot_key", "many_keys")}
    assert [c for c in tiny.split if c.errors or c.client_us <= 0 or c.server_us <= 0 or c.per_call < 1] == []
    assert len(tiny.split_floors) == 2
    assert "where a decision's time goes" in tiny.to_markdown()
