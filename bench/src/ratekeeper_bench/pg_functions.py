"""Where a PostgreSQL decision's server time goes: the store's functions, one by one.

For every algorithm, one ``Limiter`` on a schema of its own decides back to back on one
hot key (sync, one thread, a one-limit rule that admits nearly every call) with its
connections' ``track_functions = all`` (a libpq ``options`` of the store URL; it needs a
superuser, as the bench's default URL is). When the cell ends the limiter is closed, so
its backends report their counts, and ``pg_stat_user_functions`` gives each function's
calls, total and self time. Reported per decision: the wall time of the whole call as
the client saw it, and each function's self time (its own statements, without the
functions it called), so what the dispatcher, the algorithm and the sweep each cost is
visible next to what the round trip costs outside every function.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from ratekeeper_bench import report
from ratekeeper_bench.latency import time_sync

__all__ = ["FunctionCell", "FunctionTime", "measure_functions", "render_functions"]

MIN_SHARE = 0.01
"""Functions called for fewer decisions than this share are left out: the store's one-off
calls when it installs and checks its functions, not the decision's path."""
STATS_WAIT = 5.0
"""The longest the run waits for the store's exited backends to report their counts."""


@dataclass(frozen=True, slots=True)
class FunctionTime:
    """One function's share: calls per decision, self and total µs per decision."""

    name: str
    calls_per_decision: float
    self_us: float
    total_us: float


@dataclass(frozen=True, slots=True)
class FunctionCell:
    """One algorithm: the client's rate and wall µs per decision, and each function's time."""

    algorithm: str
    rate: float
    wall_us: float
    functions: tuple[FunctionTime, ...]
    errors: int


def _with_options(url: str, schema: str) -> str:
    joiner = "&" if "?" in url else "?"
    return f"{url}{joiner}schema={schema}&options={quote('-ctrack_functions=all')}"


def _function_times(url: str, schema: str, decisions: int) -> tuple[FunctionTime, ...]:
    import psycopg

    n = max(decisions, 1)
    # The store's backends report their counts as they exit, which the server finishes after
    # the client has closed: read until the counts of this run's decisions are there.
    deadline = time.monotonic() + STATS_WAIT
    with psycopg.connect(url.split("?", maxsplit=1)[0], autocommit=True) as conn:
        while True:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            rows = conn.execute(
                "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions "
                "WHERE schemaname = %s AND calls > 0 ORDER BY self_time DESC",
                (schema,),
            ).fetchall()
            if any(calls >= n * MIN_SHARE for _, calls, _, _ in rows) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    return tuple(
        FunctionTime(name, calls / n, self_ms * 1000 / n, total_ms * 1000 / n)
        for name, calls, total_ms, self_ms in rows
        if calls >= n * MIN_SHARE
    )


def _drop(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url.split("?", maxsplit=1)[0], autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def measure_functions(
    url: str, algorithms: Sequence[str], duration: float, note: Callable[[str], None] = lambda _: None
) -> list[FunctionCell]:
    """One cell per algorithm (see the module docstring); every schema is dropped at the end."""
    from ratekeeper import Limiter, Rule

    cells: list[FunctionCell] = []
    for algorithm in algorithms:
        schema = f"rkfn_{secrets.token_hex(4)}"
        try:
            limiter = Limiter(_with_options(url, schema))
            rule = Rule("fn", ["1000000000/1s"], algorithm=algorithm)
            acquire = limiter.try_acquire
            try:
                for _ in range(50):  # warm: the schema, the prepared statements, the row
                    acquire(rule, "hot")
                sample = time_sync(
                    lambda key, acquire=acquire, rule=rule: acquire(rule, key).allowed,  # type: ignore[misc]
                    itertools.repeat("hot"),
                    duration,
                )
            finally:
                limiter.close()  # its backends end, and report their function counts
            functions = _function_times(url, schema, sample.calls + 50)
        finally:
            _drop(url, schema)
        wall = 1e6 / sample.rate if sample.rate else 0.0
        cells.append(FunctionCell(algorithm, sample.rate, wall, functions, sample.errors))
        note(f"functions {algorithm}: {report.format_rate(sample.rate)}/s")
    return cells


def render_functions(cells: Sequence[FunctionCell]) -> list[str]:
    """The Markdown of this part: one row per (algorithm, function)."""
    out = [
        "### Server time per decision, function by function (sync, one thread, one hot key)",
        "",
        "From `pg_stat_user_functions` (`track_functions = all` on the store's connections), over every "
        "decision of the cell and its warm-up. *Self*: the function's own statements; *total*: with the "
        "functions it called. *Wall*: the whole call as the client saw it (the round trip, the statement's "
        "parse and commit, and the functions).",
        "",
        "| algorithm | decisions/s | wall µs | function | calls per decision | self µs | total µs |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for cell in cells:
        first = True
        for fn in cell.functions or (FunctionTime("(none reported)", 0.0, 0.0, 0.0),):
            head = (
                f"| {cell.algorithm} | {report.format_rate(cell.rate)} | {cell.wall_us:.0f} |" if first else "| | | |"
            )
            out.append(f"{head} `{fn.name}` | {fn.calls_per_decision:.3f} | {fn.self_us:.1f} | {fn.total_us:.1f} |")
            first = False
    out.append("")
    return out
