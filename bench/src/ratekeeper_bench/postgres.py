"""``ratekeeper bench postgres``: ratekeeper's PostgreSQL store against the strategies it replaces.

One run on one database (``--url``, default ``postgresql://postgres@127.0.0.1:5432/test``),
in a schema of its own (``rkbench_<pid>_<random>``) that the run creates and drops at the
end with everything in it. The subjects (see ``postgres_peers``): ratekeeper's store;
three strategies written here only (``SELECT … FOR UPDATE NOWAIT`` then ``UPDATE``, an
exclusion constraint on a ``tstzrange``, ``INSERT … ON CONFLICT DO UPDATE … WHERE …
RETURNING``); and pyrate-limiter's ``PostgresBucket``.

The same load for all: ``--workers`` threads (16 by default) sharing one limiter and a
pool of as many connections, calling back to back for ``--duration`` seconds (20 by
default) under a limit of one call per 10 ms per key, in two scenarios: one hot key, and
``--keys`` keys round robin (10,000 by default). Reported per cell: decisions/s, p50
and p99 latency, errors (exceptions other than the strategy's own denial signal),
deadlocks (the delta of ``pg_stat_database.deadlocks`` for the database, read after the
cell's connections closed and flushed their statistics; other sessions on the same
database count too), and admitted against expected: on the hot key at most
``floor(seconds / 10 ms) + 1`` (more is over-admission), on many keys every call (each
key comes back long after its 10 ms).

Then the sliding log by length (``--no-log-lengths`` skips it): one thread on one
connection, ratekeeper's sliding log held at 10, 600 and 10,000 live entries
(``LOG_LENGTHS``: a limit of L per L ms and one call per ms of the call's own time, so each
call expires one entry and appends one), for ``LOG_DURATION`` seconds each; reported:
decisions/s, the rate over the 10-entry log's, the server's time per call (the
``Execution Time`` of ``EXPLAIN ANALYZE`` of the store's own statement, averaged over
``LOG_EXPLAINS`` calls that continue the same log), and the bytes per entry (each length
has a state table of its own: ``pg_total_relation_size`` of a fresh copy of its live rows
and of its segment table's, heap, indexes and TOAST, over the log's length; at 10 entries
the pages' fixed size dominates).

Then the server's time per decision, function by function (``--no-functions`` skips it;
``pg_functions``): every algorithm on one hot key, one thread, with ``track_functions``
on the store's connections, each function's self and total µs per decision from
``pg_stat_user_functions``, next to the whole call's wall time.

The CLI calls ``add_arguments(parser)`` and ``run(args)``; ``main(argv)`` runs it alone
(``python -m ratekeeper_bench.postgres``). Progress goes to standard error, the tables
to standard output (and ``--markdown PATH``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import math
import os
import platform
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from ratekeeper_bench import options, report
from ratekeeper_bench.latency import Sample, Target, time_sync, time_threads
from ratekeeper_bench.options import add_common_options, choose, count, describe, finish
from ratekeeper_bench.peers import library_version
from ratekeeper_bench.pg_functions import FunctionCell, measure_functions, render_functions
from ratekeeper_bench.postgres_peers import SUBJECTS, Load, PgSubject, limit_text

__all__ = [
    "DEFAULT_DURATION",
    "DEFAULT_KEYS",
    "DEFAULT_URL",
    "DEFAULT_WORKERS",
    "INTERVAL",
    "LOG_LENGTHS",
    "SCENARIOS",
    "STRATEGIES",
    "Cell",
    "LogCell",
    "PostgresBenchResult",
    "Settings",
    "add_arguments",
    "bench_from_args",
    "main",
    "run",
    "run_postgres_bench",
]

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_DURATION = 20.0
DEFAULT_KEYS = 10_000
DEFAULT_WORKERS = 16
QUICK_DURATION = 0.2
QUICK_KEYS = 500
INTERVAL = 0.010
"""One call per 10 ms per key."""

LOG_LENGTHS = (10, 600, 10_000)
LOG_STEP_US = 1000
LOG_DURATION = 2.0
LOG_EXPLAINS = 50

SCENARIOS = ("hot_key", "many_keys")
STRATEGIES = ("for_update", "exclusion", "upsert")
"""The strategies written inside the benchmark; ratekeeper's targets are set against them."""
WARM_CALLS = 32
STATS_SETTLE = 0.3
"""Seconds to let closed backends flush their statistics before the deadlock counter is read."""


FUNCTION_ALGORITHMS = (
    "gcra",
    "token_bucket",
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "leaky_bucket",
)
"""The algorithms of the server-time-per-function part: every rate algorithm of the registry
(a concurrency rule's cost depends on how many leases it holds, which back-to-back
acquires without releases only grow)."""


@dataclass(frozen=True, slots=True)
class Cell:
    """One subject in one scenario."""

    subject: str
    scenario: str
    sample: Sample
    expected: int
    deadlocks: int

    @property
    def rate(self) -> float:
        return self.sample.rate

    @property
    def over_admitted(self) -> bool:
        return self.sample.allowed > self.expected


@dataclass(frozen=True, slots=True)
class LogCell:
    """The sliding log held at ``length`` entries: sync rate, server ms per call, bytes per entry."""

    length: int
    sample: Sample
    server_ms: float
    bytes: int
    """``pg_total_relation_size`` of a fresh copy of the live rows of the length's own tables."""

    @property
    def bytes_per_entry(self) -> float:
        return self.bytes / self.length

    @property
    def rate(self) -> float:
        return self.sample.rate


@dataclass(frozen=True, slots=True)
class Settings:
    """What one run measures: where, how long, how many keys and workers."""

    url: str = DEFAULT_URL
    duration: float = DEFAULT_DURATION
    keys: int = DEFAULT_KEYS
    workers: int = DEFAULT_WORKERS
    synchronous_commit: bool = False
    """For every subject's connections alike (off: ratekeeper's default)."""
    log_lengths: bool = True
    log_duration: float = LOG_DURATION
    functions: bool = True


@dataclass(slots=True)
class PostgresBenchResult:
    """Everything one run measured."""

    settings: Settings
    schema: str
    scenarios: tuple[str, ...]
    subjects: tuple[str, ...]
    python: str
    load: str
    versions: dict[str, str] = field(default_factory=dict)
    cells: list[Cell] = field(default_factory=list)
    logs: list[LogCell] = field(default_factory=list)
    functions: list[FunctionCell] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def rows(self, scenario: str) -> list[Cell]:
        return [c for c in self.cells if c.scenario == scenario]

    def cell(self, subject: str, scenario: str) -> Cell | None:
        return next((c for c in self.cells if (c.subject, c.scenario) == (subject, scenario)), None)

    def best_strategy(self, scenario: str) -> Cell | None:
        """The fastest of the three hand-written strategies in ``scenario``."""
        cells = [c for c in self.rows(scenario) if c.subject in STRATEGIES]
        return max(cells, key=lambda c: c.rate, default=None)

    def to_markdown(self) -> str:
        return render_markdown(self)


# -- measuring ----------------------------------------------------------------------------------


def _admin(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def _deadlocks(url: str) -> int:
    with _admin(url) as conn:
        row = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()
        return int(row[0]) if row else 0


def _expected(scenario: str, sample: Sample) -> int:
    if scenario == "hot_key":
        return math.floor(sample.seconds / INTERVAL) + 1
    return sample.calls


def _measure(subj: PgSubject, settings: Settings, schema: str, scenario: str) -> Cell:
    target = Target(settings.url, schema)
    keys = ["hot"] if scenario == "hot_key" else [f"k{i}" for i in range(settings.keys)]
    runner = subj.build(target, Load(INTERVAL, settings.workers, settings.synchronous_commit))
    try:
        for i in range(WARM_CALLS):
            runner.decide(f"warm-{scenario}-{i}")
        gc.collect()
        before = _deadlocks(settings.url)
        sample = time_threads(runner.decide, itertools.cycle(keys), settings.duration, settings.workers)
    finally:
        runner.close()
    time.sleep(STATS_SETTLE)
    deadlocks = _deadlocks(settings.url) - before
    return Cell(subj.name, scenario, sample, _expected(scenario, sample), deadlocks)


def measure_log(settings: Settings, schema: str, length: int) -> LogCell:
    """ratekeeper's sliding log held at ``length`` live entries (see the module docstring)."""
    from ratekeeper import Limit, Limiter, Rule
    from ratekeeper.op import Op

    table = f"log{length}"
    limiter = Limiter(settings.url, schema=schema, table=table, min_size=1, max_size=1)
    try:
        store: Any = limiter.store
        plan = Rule(f"log{length}", [Limit(length, length * LOG_STEP_US / 1e6)], algorithm="sliding_window_log").plan
        op = Op.decide(plan, "k", 1)
        clock = itertools.count(1_750_000_000_000_000, LOG_STEP_US)
        for _ in range(length):  # the log full before the cell starts
            store.decide(op, next(clock))
        sample = time_sync(
            lambda _key: bool(store.decide(op, next(clock)).allowed), itertools.repeat("k"), settings.log_duration
        )
        total_ms = 0.0
        with _admin(settings.url) as conn:
            for _ in range(LOG_EXPLAINS):
                sql, params = store.planner.plan([op], next(clock))
                plan_json = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()[0]
                total_ms += float(plan_json[0]["Execution Time"])
            size = 0
            for name in (f"{schema}.{table}", f"{schema}.{table}_log"):  # the segments, where they exist
                if conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is not None:
                    # The live rows in a fresh copy (indexes, TOAST and compression alike): the table
                    # itself also holds the versions that other sessions' snapshots keep alive.
                    conn.execute(f"CREATE TABLE {name}_live (LIKE {name} INCLUDING ALL)")
                    conn.execute(f"INSERT INTO {name}_live SELECT * FROM {name}")
                    size += int(conn.execute("SELECT pg_total_relation_size(%s)", (f"{name}_live",)).fetchone()[0])
        return LogCell(length, sample, total_ms / LOG_EXPLAINS, size)
    finally:
        limiter.close()


def run_postgres_bench(
    settings: Settings,
    scenarios: Sequence[str] | None,
    subjects: Sequence[str] | None,
    out: TextIO,
    progress: bool,
    *,
    progress_stream: TextIO | None = None,
) -> PostgresBenchResult:
    """Measure every chosen (subject, scenario) in a schema of its own, dropped at the end."""
    if settings.duration <= 0 or settings.keys < 1 or settings.workers < 1:
        raise ValueError("duration must be positive, keys and workers at least 1")
    names = tuple(s.name for s in SUBJECTS)
    chosen_scenarios = choose(scenarios, SCENARIOS, "scenario")
    chosen = choose(["ratekeeper", *subjects] if subjects else None, names, "subject")
    schema = f"rkbench_{os.getpid()}_{secrets.token_hex(3)}"
    result = PostgresBenchResult(
        settings=settings,
        schema=schema,
        scenarios=chosen_scenarios,
        subjects=chosen,
        python=f"Python {platform.python_version()} ({platform.python_implementation()}) on "
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
        load="load average at start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()),
    )
    import psycopg
    import psycopg_pool

    with _admin(settings.url) as conn:
        result.versions["PostgreSQL"] = str(conn.execute("SHOW server_version").fetchone()[0])
        conn.execute(f'CREATE SCHEMA "{schema}"')
    result.versions["psycopg"] = psycopg.__version__
    result.versions["psycopg_pool"] = psycopg_pool.__version__
    with contextlib.suppress(ImportError):
        result.versions["pyrate-limiter"] = library_version("pyrate-limiter")

    steps: list[tuple[str, PgSubject, str]] = []
    for scenario in chosen_scenarios:
        for subj in SUBJECTS:
            if subj.name not in chosen:
                continue
            if subj.hot_key_only and scenario != "hot_key":
                result.skipped.append((f"{scenario} {subj.name}", "one table per bucket: a table per key"))
                continue
            steps.append((f"{scenario} {subj.name}", subj, scenario))

    lengths = LOG_LENGTHS if settings.log_lengths else ()
    bar = report.Progress(
        progress_stream or sys.stderr, len(steps) + len(lengths) + int(settings.functions), enabled=progress
    )
    try:
        if settings.functions:
            label = "server time per function"
            bar.start(label)
            try:
                result.functions = measure_functions(settings.url, FUNCTION_ALGORITHMS, settings.log_duration, bar.note)
                summary = f"{len(result.functions)} algorithms"
            except Exception as exc:  # noqa: BLE001 - one broken cell must not lose the others
                result.failures.append((label, describe(exc)))
                summary = "failed"
            bar.finish(label, summary)
        for length in lengths:
            label = f"sliding log of {length:,} entries"
            bar.start(label)
            try:
                log = measure_log(settings, schema, length)
                result.logs.append(log)
                summary = (
                    f"{report.format_rate(log.rate)} decisions/s, server {log.server_ms:.3f} ms per call, "
                    f"{log.bytes_per_entry:.1f} bytes per entry, {log.sample.calls - log.sample.allowed} not admitted"
                )
            except Exception as exc:  # noqa: BLE001 - one broken cell must not lose the others
                result.failures.append((label, describe(exc)))
                summary = "failed"
            bar.finish(label, summary)
        for label, subj, scenario in steps:
            bar.start(label)
            try:
                cell = _measure(subj, settings, schema, scenario)
                result.cells.append(cell)
                s = cell.sample
                summary = (
                    f"{report.format_rate(s.rate)} decisions/s, p50 {s.p50_us / 1000:.2f} ms, p99 "
                    f"{s.p99_us / 1000:.2f} ms, {s.allowed} admitted of {cell.expected} expected, {s.errors} errors, "
                    f"{cell.deadlocks} deadlocks"
                )
                if s.first_error:
                    summary += f" ({s.first_error})"
            except Exception as exc:  # noqa: BLE001 - one broken cell must not lose the others
                result.failures.append((label, describe(exc)))
                bar.note(f"{label}: failed: {describe(exc)}")
                summary = "failed"
            bar.finish(label, summary)
    finally:
        bar.close()
        with _admin(settings.url) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    out.write(result.to_markdown())
    out.flush()
    return result


# -- the report ---------------------------------------------------------------------------------


def _times(value: float, of: float) -> str:
    return f"{value / of:.2f}×" if of > 0 else "n/a"


def render_markdown(result: PostgresBenchResult) -> str:
    """Settings, one table per scenario, what each row runs, failures."""
    s = result.settings
    versions = ", ".join(f"{k} {v}" for k, v in result.versions.items())
    out = [
        "## PostgreSQL store: ratekeeper against the strategies it replaces",
        "",
        f"One run on `{s.url}` in schema `{result.schema}` (dropped at the end): {result.python}; {versions}; "
        f"{result.load}.",
        f"Every cell: {s.workers} threads sharing one limiter and a pool of {s.workers} connections, calling "
        f"back to back for {s.duration:g} s, limit {limit_text(INTERVAL)} per key (one call per "
        f"{INTERVAL * 1000:g} ms), `synchronous_commit` {'on' if s.synchronous_commit else 'off'} on every "
        "connection (ratekeeper's default is off; the same for all, so the statements are compared, not "
        "durability settings). Latency per call (`perf_counter_ns`). *expected*: on the hot key the most "
        "that may be admitted in the cell's time (`floor(seconds / 10 ms) + 1`), on many keys every call. "
        "*errors*: exceptions other than the strategy's own denial signal. *deadlocks*: delta of "
        "`pg_stat_database.deadlocks` over the cell (the whole database: other sessions count too). "
        "*compared*: ratekeeper over the best of the three strategies; the others over ratekeeper.",
        "",
    ]
    for scenario in result.scenarios:
        rows = result.rows(scenario)
        if not rows:
            continue
        keys = "one key" if scenario == "hot_key" else f"{s.keys:,} keys round robin"
        out += [
            f"### `{scenario}` ({keys})",
            "",
            "| subject | decisions/s | p50 ms | p99 ms | admitted | expected | errors | deadlocks | compared |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        ours = result.cell("ratekeeper", scenario)
        best = result.best_strategy(scenario)
        for cell in rows:
            sample = cell.sample
            if cell.subject == "ratekeeper":
                versus = (
                    f"{_times(cell.rate, best.rate)} rate, p99 {_times(sample.p99_us, best.sample.p99_us)} of "
                    f"best strategy ({best.subject})"
                    if best
                    else "n/a"
                )
            else:
                versus = f"{_times(cell.rate, ours.rate)} ratekeeper's rate" if ours else "n/a"
            admitted = f"**{sample.allowed}**" if cell.over_admitted else str(sample.allowed)
            out.append(
                f"| {cell.subject} | {report.format_rate(cell.rate)} | {sample.p50_us / 1000:.2f} | "
                f"{sample.p99_us / 1000:.2f} | {admitted} | {cell.expected} | {sample.errors} | {cell.deadlocks} | "
                f"{versus} |"
            )
        out.append("")
    if result.logs:
        short = result.logs[0]
        out += [
            "### The sliding log by length (one thread, one connection)",
            "",
            f"ratekeeper's sliding log held at L entries: a limit of L per L ms, one call per ms of the call's own "
            f"time (`store.decide(op, now)`), {s.log_duration:g} s per cell. *server ms*: `Execution Time` of "
            f"`EXPLAIN ANALYZE` of the store's statement, the mean of {LOG_EXPLAINS} calls continuing the log. "
            "*bytes per entry*: `pg_total_relation_size` of a fresh copy of the live rows of the length's own tables "
            "(state and segments, with their indexes) over the length (at 10 entries, mostly the pages' fixed size).",
            "",
            "| entries | decisions/s | × the shortest | p50 ms | p99 ms | server ms per call | bytes per entry | "
            "not admitted |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for log in result.logs:
            sample = log.sample
            out.append(
                f"| {log.length:,} | {report.format_rate(log.rate)} | {_times(log.rate, short.rate)} | "
                f"{sample.p50_us / 1000:.2f} | {sample.p99_us / 1000:.2f} | {log.server_ms:.3f} | "
                f"{log.bytes_per_entry:.1f} | {sample.calls - sample.allowed} |"
            )
        if len(result.logs) > 1:
            a, b = result.logs[-2], result.logs[-1]
            added = (b.bytes - a.bytes) / (b.length - a.length)
            out += ["", f"Bytes per entry added from {a.length:,} to {b.length:,} entries: {added:.1f}."]
        out.append("")
    if result.functions:
        out += render_functions(result.functions)
    out += ["What each row runs:", ""]
    out += [f"- {subj.name}: {subj.how}" for subj in SUBJECTS if subj.name in result.subjects]
    for label, reason in result.skipped:
        out.append(f"- {label}: not measured ({reason})")
    errors = [(c.subject, c.scenario, c.sample.first_error) for c in result.cells if c.sample.first_error]
    if errors:
        out += ["", "First error of each cell that had errors:", ""]
        out += [f"- {scenario} {subject}: {error}" for subject, scenario, error in errors]
    if result.failures:
        out += ["", "Steps that failed:", ""]
        out += [f"- {label}: {error}" for label, error in result.failures]
    out.append("")
    return "\n".join(out)


# -- command line -------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``ratekeeper bench postgres`` to ``parser``."""
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the database to use (default {DEFAULT_URL})")
    add_common_options(
        parser, duration=DEFAULT_DURATION, quick_duration=QUICK_DURATION, keys=DEFAULT_KEYS, quick_keys=QUICK_KEYS
    )
    parser.add_argument(
        "--workers",
        type=count(1),
        default=DEFAULT_WORKERS,
        metavar="N",
        help=f"concurrent threads and connections (default {DEFAULT_WORKERS})",
    )
    parser.add_argument(
        "--synchronous-commit",
        action="store_true",
        help="every commit waits for its WAL flush, for every subject (default: off for all, ratekeeper's default)",
    )
    parser.add_argument(
        "--no-log-lengths", action="store_false", dest="log_lengths", help="skip the sliding log by length"
    )
    parser.add_argument(
        "--no-functions", action="store_false", dest="functions", help="skip the server's time per function"
    )
    options.add_scenario_option(parser, SCENARIOS)
    names = [s.name for s in SUBJECTS[1:]]
    options.add_peer_option(parser, "--subject", "subjects", names, names, what="one")


def bench_from_args(
    args: argparse.Namespace, out: TextIO, progress_stream: TextIO | None = None
) -> PostgresBenchResult:
    """Run the benchmark as parsed by a parser given ``add_arguments``."""
    quick: bool = args.quick
    settings = Settings(
        url=args.url,
        duration=options.or_default(args.duration, quick, DEFAULT_DURATION, QUICK_DURATION),
        keys=options.or_default(args.keys, quick, DEFAULT_KEYS, QUICK_KEYS),
        workers=args.workers,
        synchronous_commit=args.synchronous_commit,
        log_lengths=args.log_lengths,
        functions=args.functions,
        log_duration=min(LOG_DURATION, args.duration)
        if args.duration is not None
        else (QUICK_DURATION if quick else LOG_DURATION),
    )
    return run_postgres_bench(
        settings, args.scenarios, args.subjects, out, args.progress, progress_stream=progress_stream
    )


def run(args: argparse.Namespace) -> int:
    """Run from parsed arguments: tables to standard output (and ``--markdown``); 1 if a step failed."""
    return finish(bench_from_args(args, sys.stdout), args.markdown)


def main(argv: Sequence[str] | None = None) -> int:
    return options.command_main(
        argv,
        "ratekeeper bench postgres",
        "Compare ratekeeper's PostgreSQL store with the strategies it replaces and pyrate-limiter.",
        add_arguments,
        run,
    )


if __name__ == "__main__":
    raise SystemExit(main())
