"""``ratekeeper bench memory`` measures every library in every scenario, and each scenario
behaves as its name says for every library (so the rates compare like with like)."""

from __future__ import annotations

import argparse
import io
import threading
from pathlib import Path

import pytest

from ratekeeper_bench import memory, report
from ratekeeper_bench.peers import LIBRARIES, subjects

pytestmark = pytest.mark.slow  # a benchmark run


@pytest.fixture(scope="module")
def quick() -> memory.BenchResult:
    parser = argparse.ArgumentParser()
    memory.add_arguments(parser)
    args = parser.parse_args(["--quick", "--no-progress"])
    return memory.bench_from_args(args, io.StringIO())


def _expected_subjects() -> set[tuple[str, str]]:
    return {(s.library, s.algorithm) for library in LIBRARIES for s in subjects(library)}


def test_quick_run_has_one_row_per_library_algorithm_and_scenario(quick: memory.BenchResult) -> None:
    assert quick.failures == []
    assert quick.skipped == {}
    expected = {(lib, algo, scenario) for lib, algo in _expected_subjects() for scenario in memory.SCENARIOS}
    actual = [(c.library, c.algorithm, c.scenario) for c in quick.cells]
    assert expected == set(actual)
    assert len(expected) == len(actual)


def test_every_cell_has_a_positive_rate(quick: memory.BenchResult) -> None:
    slow = [c for c in quick.cells if not (c.calls > 0 and c.seconds > 0 and c.rate > 0)]
    assert slow == []


def test_denied_scenarios_are_mostly_denied_for_every_library(quick: memory.BenchResult) -> None:
    denied = [c for c in quick.cells if not memory.SCENARIOS[c.scenario].expect_allowed]
    assert {c.scenario for c in denied} == {"hot_key_denied", "many_keys_denied"}
    wrong = [(c.library, c.algorithm, c.scenario, c.allowed_fraction) for c in denied if c.allowed_fraction > 0.1]
    assert wrong == []


def test_allowed_scenarios_are_mostly_allowed_for_every_library(quick: memory.BenchResult) -> None:
    allowed = [c for c in quick.cells if memory.SCENARIOS[c.scenario].expect_allowed]
    assert {c.scenario for c in allowed} == {"hot_key_allowed", "many_keys"}
    wrong = [(c.library, c.algorithm, c.scenario, c.allowed_fraction) for c in allowed if c.allowed_fraction < 0.9]
    assert wrong == []


def test_each_peer_cell_is_compared_with_a_comparable_ratekeeper_algorithm(quick: memory.BenchResult) -> None:
    for cell in quick.cells:
        if cell.library == "ratekeeper":
            continue
        ratio = quick.ratio(cell)
        assert ratio is not None, cell
        value, algorithm = ratio
        assert algorithm in cell.comparable
        reference = quick.cell("ratekeeper", algorithm, cell.scenario)
        assert reference is not None
        assert value == pytest.approx(cell.rate / reference.rate)
        ours = [c for c in quick.rows(cell.scenario) if c.library == "ratekeeper"]
        assert reference.rate == max(c.rate for c in ours if c.algorithm in cell.comparable)


def test_memory_per_idle_key_is_measured_for_every_library_and_algorithm(quick: memory.BenchResult) -> None:
    assert {(m.library, m.algorithm) for m in quick.memory} == _expected_subjects()
    for mem in quick.memory:
        assert mem.keys == memory.QUICK_MEMORY_KEYS
        assert mem.allowed == mem.keys  # one use each, under a limit of 10: every key holds state
        assert mem.bytes_per_key > 0


def test_markdown_has_a_table_per_scenario_and_one_for_memory(quick: memory.BenchResult) -> None:
    text = quick.to_markdown()
    for scenario in memory.SCENARIOS:
        assert f"### `{scenario}`" in text
    assert text.count("| library | algorithm | decisions/s | allowed | vs ratekeeper |") == len(memory.SCENARIOS)
    assert "### Memory per idle key" in text
    assert "| limits | moving_window |" in text


def test_main_prints_the_tables_writes_them_to_markdown_and_logs_plain_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bench.md"
    argv = ["--quick", "--duration", "0.01", "--scenario", "hot_key_denied", "--library", "limits"]
    assert memory.main([*argv, "--memory-keys", "0", "--markdown", str(path)]) == 0
    captured = capsys.readouterr()
    written = path.read_text(encoding="utf-8")
    assert captured.out == written
    assert "| limits | fixed_window |" in written
    assert "pyrate-limiter" not in written
    assert "Memory per idle key" not in written
    progress = captured.err.splitlines()
    assert len(progress) == 10  # six ratekeeper algorithms, gcra+observer and three of limits, one line each
    assert progress[0].startswith("[ 1/10] hot_key_denied ratekeeper fixed_window: ")
    assert "\r" not in captured.err


def test_unknown_scenario_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown scenario 'cold_key'"):
        memory.run_memory_bench(0.01, ["cold_key"], None, io.StringIO(), False)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_rewrites_one_line_on_a_terminal() -> None:
    stream = _Terminal()
    bar = report.Progress(stream, 2)
    bar.start("first")
    bar.finish("first", "done")
    bar.start("second")
    bar.finish("second", "done")
    bar.close()
    text = stream.getvalue()
    assert "\n" not in text
    assert "\r[2/2] second: done" in text
    assert text.endswith("\r")


def test_progress_writes_plain_lines_elsewhere() -> None:
    stream = io.StringIO()
    bar = report.Progress(stream, 2)
    bar.start("first")
    bar.finish("first", "1 decisions/s")
    bar.close()
    assert stream.getvalue() == "[1/2] first: 1 decisions/s\n"


def test_exceptions_in_background_threads_are_recorded_not_printed() -> None:
    sink: list[str] = []

    def fail() -> None:
        raise KeyError("gone")

    with memory._thread_errors(sink, lambda: "many_keys limits fixed_window"):
        thread = threading.Thread(target=fail)
        thread.start()
        thread.join()
    assert len(sink) == 1
    assert sink[0].startswith("KeyError in ")
    assert sink[0].endswith("fail(), during many_keys limits fixed_window")
