"""``ratekeeper bench postgres`` measures ratekeeper and every strategy on the real PostgreSQL,
counts admissions against the limit, and drops the schema it created."""

from __future__ import annotations

import argparse
import io

import psycopg
import pytest

from ratekeeper_bench import postgres as bench
from ratekeeper_bench.postgres_peers import SUBJECTS

pytestmark = [pytest.mark.postgres, pytest.mark.slow]  # slow: a benchmark run


@pytest.fixture(scope="module")
def tiny() -> bench.PostgresBenchResult:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--quick", "--duration", "0.2", "--keys", "300", "--workers", "4", "--no-progress"])
    return bench.bench_from_args(args, io.StringIO())


def test_tiny_run_has_a_row_for_every_subject_and_scenario(tiny: bench.PostgresBenchResult) -> None:
    assert tiny.failures == []
    expected = {(s.name, sc) for s in SUBJECTS for sc in bench.SCENARIOS if sc == "hot_key" or not s.hot_key_only}
    actual = [(c.subject, c.scenario) for c in tiny.cells]
    assert expected == set(actual)
    assert len(expected) == len(actual)
    assert tiny.skipped == [("many_keys pyrate-limiter", "one table per bucket: a table per key")]


def test_every_cell_has_a_positive_rate_and_latencies(tiny: bench.PostgresBenchResult) -> None:
    wrong = [
        (c.subject, c.scenario)
        for c in tiny.cells
        if not (c.sample.calls > 0 and c.rate > 0 and 0 < c.sample.p50_us <= c.sample.p99_us and c.deadlocks >= 0)
    ]
    assert wrong == []


def test_ratekeeper_never_over_admits_the_hot_key_and_admits_nearly_every_call_on_many_keys(
    tiny: bench.PostgresBenchResult,
) -> None:
    """On many keys a key comes back about every 30 ms under a limit of one per 10 ms, so
    nearly every call is admitted; not every one: 16 threads share one key cycle on 2 cores,
    and a thread that stalls between taking its key and sending it can meet the next
    round's call for that key within 10 ms, which is then rightly refused."""
    hot = tiny.cell("ratekeeper", "hot_key")
    many = tiny.cell("ratekeeper", "many_keys")
    assert hot is not None and many is not None
    assert hot.sample.errors == 0 and many.sample.errors == 0
    assert 0 < hot.sample.allowed <= hot.expected
    assert many.expected == many.sample.calls
    assert 0.99 * many.sample.calls <= many.sample.allowed <= many.sample.calls


def test_markdown_has_a_table_per_scenario_comparing_ratekeeper_with_the_best_strategy(
    tiny: bench.PostgresBenchResult,
) -> None:
    text = tiny.to_markdown()
    assert "### `hot_key` (one key)" in text
    assert "### `many_keys` (300 keys round robin)" in text
    assert text.count("of best strategy (") == 2
    assert "| pyrate-limiter |" in text


def test_the_run_drops_its_schema(tiny: bench.PostgresBenchResult) -> None:
    assert tiny.schema.startswith("rkbench_")
    with psycopg.connect(bench.DEFAULT_URL) as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (tiny.schema,)).fetchone()
    assert found is None


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="workers at least 1"):
        bench.run_postgres_bench(bench.Settings(workers=0), None, None, io.StringIO(), False)
    with pytest.raises(ValueError, match="unknown subject 'sqlite'"):
        bench.run_postgres_bench(bench.Settings(duration=0.1), None, ["sqlite"], io.StringIO(), False)


def test_the_sliding_log_by_length_admits_every_call_and_times_the_server(tiny: bench.PostgresBenchResult) -> None:
    assert [log.length for log in tiny.logs] == list(bench.LOG_LENGTHS)
    for log in tiny.logs:
        assert log.sample.calls > 0 and log.sample.errors == 0
        assert log.sample.allowed == log.sample.calls  # the log stays at its length: every call fits
        assert log.server_ms > 0
    assert "### The sliding log by length" in tiny.to_markdown()


def test_the_server_time_per_function_covers_every_rate_algorithm(tiny: bench.PostgresBenchResult) -> None:
    assert [c.algorithm for c in tiny.functions] == list(bench.FUNCTION_ALGORITHMS)
    for cell in tiny.functions:
        assert cell.errors == 0 and cell.rate > 0
        assert cell.functions, f"{cell.algorithm}: no function reported"
        assert all(f.total_us >= f.self_us >= 0 for f in cell.functions)
    assert "### Server time per decision, function by function" in tiny.to_markdown()
