"""``ratekeeper bench memory``: the memory store against the in-memory stores of its peers.

One process, one run: ratekeeper's memory store with each of its algorithms, and the
in-memory stores of ``limits`` (fixed window, moving window, sliding window counter),
``pyrate-limiter`` (sliding window log, fixed window, GCRA, token bucket) and
``throttled-py`` (fixed window, sliding window, token bucket, leaking bucket, GCRA).

Every (library, algorithm, scenario) cell makes synchronous decisions back to back for
a fixed duration and reports decisions per second, the fraction allowed (so one can see
that the scenario behaved as intended for every library) and, for a peer, its rate
divided by the rate of ratekeeper's fastest comparable algorithm. A last pass measures
the memory each library keeps per idle key.

Choices that shape the numbers:

- The allowed scenarios use 1,000,000,000 per second: limits and throttled-py take whole
  seconds only, and a one-second window bounds what the log algorithms keep (one entry
  per admitted call), which they must pay for on a hot key.
- Before the clock starts every key is used once, and in the denied scenarios until its
  limit is spent, so cells measure a warm store and the denied cells deny from the first
  call.
- Cells run one after another in one process; ``Cell.cpu_share`` (CPU time over wall
  time) exposes a machine busy with other work, and the report warns when it is low.
- Exceptions in the peers' own background threads are recorded in the report instead
  of being printed over the progress line.

Defaults take a few minutes: 18 subjects x 4 scenarios x 2 s, plus the memory pass
(200,000 keys per subject under ``tracemalloc``, which slows every allocation).

The CLI calls ``add_arguments(parser)`` and ``run(args)``; ``main(argv)`` runs it alone
(``python -m ratekeeper_bench.memory``). Progress goes to standard error, the tables to
standard output (and to ``--markdown PATH``).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import platform
import sys
import threading
import time
import traceback
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ratekeeper_bench import options, report
from ratekeeper_bench.options import add_common_options, choose, count, describe, finish
from ratekeeper_bench.peers import (
    LIBRARIES,
    LIBRARY_ALIASES,
    LimitSpec,
    Loop,
    Subject,
    library_version,
    subjects,
)

__all__ = [
    "DEFAULT_DURATION",
    "DEFAULT_KEYS",
    "DEFAULT_MEMORY_KEYS",
    "MEMORY_SPEC",
    "SCENARIOS",
    "BenchResult",
    "Cell",
    "Failure",
    "MemoryCell",
    "Scenario",
    "add_arguments",
    "bench_from_args",
    "main",
    "run",
    "run_memory_bench",
]

DEFAULT_DURATION = 2.0
DEFAULT_KEYS = 100_000
DEFAULT_MEMORY_KEYS = 200_000
QUICK_DURATION = 0.03
QUICK_KEYS = 1_000
QUICK_MEMORY_KEYS = 1_000

CLOCK_EVERY = 1000
"""Calls between two readings of the clock once a cell is warm."""

WARM_KEYS = 1000
"""Keys used before the memory baseline, so lazily built structures are not counted per key."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """The same workload for every library: one limit, one key or many, expected outcome."""

    name: str
    spec: LimitSpec
    many_keys: bool
    expect_allowed: bool
    description: str


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("hot_key_allowed", LimitSpec(1_000_000_000, 1), False, True, "nearly every call allowed"),
        Scenario(
            "hot_key_denied",
            LimitSpec(10, 3600),
            False,
            False,
            "limit spent before timing: nearly every call denied",
        ),
        Scenario("many_keys", LimitSpec(1_000_000_000, 1), True, True, "nearly every call allowed"),
        Scenario(
            "many_keys_denied",
            LimitSpec(1, 3600),
            True,
            False,
            "each key's limit spent before timing: nearly every call denied",
        ),
    )
}

MEMORY_SPEC = LimitSpec(10, 3600)
"""The limit for the idle keys: one use leaves every algorithm with state to keep for minutes."""


@dataclass(frozen=True, slots=True)
class Cell:
    """Decisions of one library and algorithm in one scenario."""

    library: str
    algorithm: str
    scenario: str
    comparable: tuple[str, ...]
    calls: int
    allowed: int
    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        """Decisions per second, allowed and denied alike."""
        return self.calls / self.seconds if self.seconds > 0 else 0.0

    @property
    def allowed_fraction(self) -> float:
        return self.allowed / self.calls if self.calls else 0.0

    @property
    def cpu_share(self) -> float:
        """CPU time of this process over wall time: well below 1 when other load competed."""
        return self.cpu_seconds / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class MemoryCell:
    """Memory kept by one library and algorithm for ``keys`` idle keys."""

    library: str
    algorithm: str
    comparable: tuple[str, ...]
    keys: int
    allowed: int
    bytes: int

    @property
    def bytes_per_key(self) -> float:
        return self.bytes / self.keys if self.keys else 0.0


@dataclass(frozen=True, slots=True)
class Failure:
    """A cell that raised; ``scenario`` is ``"memory"`` for the memory pass."""

    library: str
    algorithm: str
    scenario: str
    error: str


@dataclass(slots=True)
class BenchResult:
    """Everything one run measured, and the ratios derived from it."""

    duration: float
    keys: int
    memory_keys: int
    scenarios: tuple[str, ...]
    libraries: tuple[str, ...]
    python: str
    versions: dict[str, str] = field(default_factory=dict)
    calls: dict[tuple[str, str], str] = field(default_factory=dict)
    cells: list[Cell] = field(default_factory=list)
    memory: list[MemoryCell] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    thread_errors: list[str] = field(default_factory=list)
    """Exceptions raised in the libraries' own background threads (the run goes on)."""

    def cell(self, library: str, algorithm: str, scenario: str) -> Cell | None:
        for c in self.cells:
            if (c.library, c.algorithm, c.scenario) == (library, algorithm, scenario):
                return c
        return None

    def rows(self, scenario: str) -> list[Cell]:
        """The cells of one scenario: ratekeeper's algorithms first, then each peer's."""
        return [c for c in self.cells if c.scenario == scenario]

    def reference(self, scenario: str, comparable: Sequence[str]) -> Cell | None:
        """ratekeeper's fastest cell among ``comparable`` algorithms in ``scenario``."""
        candidates = [
            c for c in self.cells if c.library == "ratekeeper" and c.scenario == scenario and c.algorithm in comparable
        ]
        return max(candidates, key=lambda c: c.rate, default=None)

    def ratio(self, cell: Cell) -> tuple[float, str] | None:
        """``cell``'s rate over ratekeeper's best comparable rate, and that algorithm."""
        ref = self.reference(cell.scenario, cell.comparable)
        if ref is None or ref.rate <= 0:
            return None
        return cell.rate / ref.rate, ref.algorithm

    def memory_reference(self, comparable: Sequence[str]) -> MemoryCell | None:
        """ratekeeper's smallest memory cell among ``comparable`` algorithms."""
        candidates = [m for m in self.memory if m.library == "ratekeeper" and m.algorithm in comparable]
        return min(candidates, key=lambda m: m.bytes_per_key, default=None)

    def memory_ratio(self, mem: MemoryCell) -> tuple[float, str] | None:
        ref = self.memory_reference(mem.comparable)
        if ref is None or ref.bytes_per_key <= 0:
            return None
        return mem.bytes_per_key / ref.bytes_per_key, ref.algorithm

    def to_markdown(self) -> str:
        return report.render_markdown(self)


# -- measuring ----------------------------------------------------------------------------


def _timed(loop: Loop, keys: Iterator[str], duration: float) -> tuple[int, int, float, float]:
    """Call ``loop`` until ``duration`` has passed; return (calls, allowed, seconds, CPU seconds).

    The clock is read every ``CLOCK_EVERY`` calls. The first batches are 1, 10 and 100
    calls, kept small while one call is slow, so a slow library does not overrun the
    duration by a thousand slow calls.
    """
    perf = time.perf_counter
    calls = allowed = 0
    batch = 1
    small = duration / 100
    cpu = time.process_time()
    start = last = perf()
    deadline = start + duration
    while True:
        allowed += loop(keys, batch)
        calls += batch
        now = perf()
        if now >= deadline:
            return calls, allowed, now - start, time.process_time() - cpu
        if batch < CLOCK_EVERY and now - last < small:
            batch = min(CLOCK_EVERY, batch * 10)
        last = now


def _measure_rate(subject: Subject, scenario: Scenario, keys: list[str], duration: float) -> Cell:
    runner = subject.build(scenario.spec, len(keys))
    try:
        # Untimed: every key once, so the clock sees a warm store; in the denied scenarios
        # every key's limit is spent, so their cells are denials from the first call.
        passes = 1 if scenario.expect_allowed else scenario.spec.count
        runner.loop(iter(keys * passes), len(keys) * passes)
        gc.collect()
        calls, allowed, seconds, cpu = _timed(runner.loop, itertools.cycle(keys), duration)
    finally:
        runner.close()
    return Cell(subject.library, subject.algorithm, scenario.name, subject.comparable, calls, allowed, seconds, cpu)


def _measure_memory(subject: Subject, keys: list[str]) -> MemoryCell:
    """Traced memory growth after using each of ``keys`` once.

    ``keys`` (and the warm-up keys) exist before tracing starts, so their strings are
    not counted; anything a library builds from them is.
    """
    warm = [f"warm-{i}" for i in range(WARM_KEYS)]
    gc.collect()
    tracemalloc.start()
    try:
        runner = subject.build(MEMORY_SPEC, len(keys) + len(warm))
        try:
            runner.loop(iter(warm), len(warm))
            runner.settle()
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            allowed = runner.loop(iter(keys), len(keys))
            runner.settle()
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            runner.close()
    finally:
        tracemalloc.stop()
    return MemoryCell(subject.library, subject.algorithm, subject.comparable, len(keys), allowed, after - before)


@contextmanager
def _thread_errors(sink: list[str], step: Callable[[], str]) -> Iterator[None]:
    """Record exceptions of background threads (a peer's expiry timer, say) in ``sink``.

    They would otherwise be printed through the progress display; the benchmark goes
    on, as the library's own callers would.
    """
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        where = ""
        if args.exc_traceback is not None:
            last = traceback.extract_tb(args.exc_traceback)[-1]
            path = Path(last.filename)
            where = f" in {path.parent.name}/{path.name} {last.name}()"
        sink.append(f"{args.exc_type.__name__}{where}, during {step()}")

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous


def run_memory_bench(
    duration: float,
    scenarios: list[str] | None,
    libraries: list[str] | None,
    out: TextIO,
    progress: bool,
    *,
    keys: int = DEFAULT_KEYS,
    memory_keys: int = DEFAULT_MEMORY_KEYS,
    progress_stream: TextIO | None = None,
) -> BenchResult:
    """Measure every chosen (library, algorithm, scenario), then memory per idle key.

    ``scenarios`` and ``libraries`` default to all of them; ratekeeper is always
    measured, being the reference of every ratio. ``keys`` is the key count of the
    ``many_keys`` scenarios, ``memory_keys`` the idle keys of the memory pass (0 skips
    it). Progress goes to ``progress_stream`` (standard error by default) and the
    Markdown tables to ``out``.
    """
    if duration <= 0:
        raise ValueError(f"duration must be positive, got {duration!r}")
    if keys < 1 or memory_keys < 0:
        raise ValueError("keys must be at least 1 and memory_keys at least 0")
    chosen_scenarios = choose(scenarios, tuple(SCENARIOS), "scenario")
    named = [LIBRARY_ALIASES.get(lib, lib) for lib in libraries or ()]
    chosen_libraries = choose(["ratekeeper", *named] if named else None, LIBRARIES, "library")

    result = BenchResult(
        duration=duration,
        keys=keys,
        memory_keys=memory_keys,
        scenarios=chosen_scenarios,
        libraries=chosen_libraries,
        python=f"Python {platform.python_version()} ({platform.python_implementation()}) on "
        f"{platform.system()} {platform.machine()}",
    )
    measured: list[Subject] = []
    for library in chosen_libraries:
        try:
            found = subjects(library)
            result.versions[library] = library_version(library)
        except ImportError as exc:
            result.skipped[library] = f"cannot import it: {describe(exc)}"
            continue
        measured += found
        result.calls.update({(s.library, s.algorithm): s.how for s in found})

    steps: list[tuple[str, Subject, Scenario | None]] = [
        (f"{name} {subject.library} {subject.algorithm}", subject, SCENARIOS[name])
        for name in chosen_scenarios
        for subject in measured
    ]
    if memory_keys:
        steps += [(f"memory {subject.library} {subject.algorithm}", subject, None) for subject in measured]
    bar = report.Progress(progress_stream if progress_stream is not None else sys.stderr, len(steps), enabled=progress)
    for library, reason in result.skipped.items():
        bar.note(f"skipping {library}: {reason}")

    many = [f"key-{i}" for i in range(keys)]
    idle = [f"idle-{i}" for i in range(memory_keys)]
    current = ""
    with _thread_errors(result.thread_errors, lambda: current):
        try:
            for current, subject, scenario in steps:
                bar.start(current)
                try:
                    if scenario is None:
                        mem = _measure_memory(subject, idle)
                        result.memory.append(mem)
                        summary = f"{report.format_bytes(mem.bytes_per_key)} bytes/key"
                    else:
                        cell = _measure_rate(subject, scenario, many if scenario.many_keys else ["hot-key"], duration)
                        result.cells.append(cell)
                        rate, share = report.format_rate(cell.rate), report.format_fraction(cell.allowed_fraction)
                        summary = f"{rate} decisions/s, {share} allowed"
                except Exception as exc:  # noqa: BLE001 - one broken cell must not lose the others
                    where = "memory" if scenario is None else scenario.name
                    result.failures.append(Failure(subject.library, subject.algorithm, where, describe(exc)))
                    bar.note(f"{current}: failed: {describe(exc)}")
                    summary = "failed"
                bar.finish(current, summary)
                gc.collect()
        finally:
            bar.close()

    out.write(result.to_markdown())
    out.flush()
    return result


# -- command line -------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``ratekeeper bench memory`` to ``parser``."""
    add_common_options(
        parser,
        duration=DEFAULT_DURATION,
        quick_duration=QUICK_DURATION,
        keys=DEFAULT_KEYS,
        quick_keys=QUICK_KEYS,
        keys_help="keys of the many_keys scenarios",
    )
    options.add_scenario_option(parser, tuple(SCENARIOS))
    options.add_peer_option(parser, "--library", "libraries", (*LIBRARIES, *LIBRARY_ALIASES), LIBRARIES[1:])
    parser.add_argument(
        "--memory-keys",
        type=count(0),
        default=None,
        metavar="N",
        help=f"idle keys for bytes per key, 0 to skip "
        f"(default {DEFAULT_MEMORY_KEYS:,}; {QUICK_MEMORY_KEYS:,} with --quick)",
    )


def bench_from_args(args: argparse.Namespace, out: TextIO, progress_stream: TextIO | None = None) -> BenchResult:
    """Run the benchmark as parsed by a parser given ``add_arguments``."""
    quick: bool = args.quick
    duration: float = options.or_default(args.duration, quick, DEFAULT_DURATION, QUICK_DURATION)
    keys: int = options.or_default(args.keys, quick, DEFAULT_KEYS, QUICK_KEYS)
    memory_keys: int = options.or_default(args.memory_keys, quick, DEFAULT_MEMORY_KEYS, QUICK_MEMORY_KEYS)
    return run_memory_bench(
        duration,
        args.scenarios,
        args.libraries,
        out,
        args.progress,
        keys=keys,
        memory_keys=memory_keys,
        progress_stream=progress_stream,
    )


def run(args: argparse.Namespace) -> int:
    """Run from parsed arguments: tables to standard output (and ``--markdown``); 1 if a cell failed."""
    return finish(bench_from_args(args, sys.stdout), args.markdown)


def main(argv: Sequence[str] | None = None) -> int:
    return options.command_main(
        argv,
        "ratekeeper bench memory",
        "Compare ratekeeper's memory store with limits, pyrate-limiter and throttled-py.",
        add_arguments,
        run,
    )


if __name__ == "__main__":
    raise SystemExit(main())
