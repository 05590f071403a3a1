"""The arguments and the run of ``ratekeeper loadtest``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ratekeeper.loadtest.engine import RunResult, run_plan
from ratekeeper.loadtest.live import LiveView
from ratekeeper.loadtest.outputs import print_summary, verdict, write_outputs
from ratekeeper.loadtest.profiles import Plan, load_plan, parse_duration
from ratekeeper.loadtest.scenario import AppServer, scenario_plan

__all__ = ["add_arguments", "run"]

SHORT_SECONDS = 3.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="?", type=Path, help="a YAML file of profiles; without it, the built-in scenario")
    p.add_argument("--target", help="the base URL to load (overrides the file's target)")
    p.add_argument("--duration", type=parse_duration, help="each profile's length (overrides the file's: 60s, 3m)")
    p.add_argument("--out", type=Path, default=Path("loadtest-out"), help="where results go (default: %(default)s)")
    p.add_argument("--pid", type=int, help="the server's pid, to chart its memory (memory.png)")
    p.add_argument("--trials", type=int, default=None, help="how many runs (built-in scenario: 4, a file: 1)")
    p.add_argument("--short", action="store_true", help=f"one trial of {SHORT_SECONDS:g} s (the tests' mode)")
    p.add_argument("--seed", type=int, default=0, help="the seed of Poisson arrivals")
    p.add_argument("--timeout", type=parse_duration, help="seconds a request may take (default 5s)")
    p.add_argument("--no-live", action="store_true", help="no live display (it is off anyway when not on a terminal)")
    p.add_argument("--no-charts", action="store_true", help="skip the PNG charts")


def run(args: argparse.Namespace) -> int:
    if args.file is not None:
        try:  # read once up front, so a bad file is told before anything starts
            load_plan(args.file, args.target, SHORT_SECONDS if args.short else args.duration)
        except (OSError, ValueError) as exc:
            print(f"ratekeeper loadtest: error: {args.file}: {exc}", file=sys.stderr)
            return 2
    console = Console()
    if not console.is_terminal:  # a log or a pipe: wide enough that the table's cells stay whole
        console = Console(width=160)
    trials = 1 if args.short else (args.trials or (1 if args.file else 4))
    seconds = SHORT_SECONDS if args.short else args.duration
    results: list[dict[str, Any]] = []
    for trial in range(1, trials + 1):
        out = args.out if trials == 1 else args.out / f"trial-{trial}"
        if trials > 1:
            console.print(f"[bold]trial {trial} of {trials}[/bold]")
        if args.file is None:
            with tempfile.TemporaryDirectory(prefix="ratekeeper-loadtest-") as logs, AppServer(Path(logs)) as server:
                plan = scenario_plan(server.url, seconds or 60.0)
                summary = _run_one(args, console, plan, out, server.pid)
        else:
            plan = load_plan(args.file, args.target, seconds)
            summary = _run_one(args, console, plan, out, args.pid)
        results.append(summary)
    if trials > 1:
        (args.out / "trials.json").write_text(json.dumps(results, indent=2) + "\n")
        console.print(_trials_table(results))
    failed = any(verdict(e).startswith("FAIL") for s in results for e in s["profiles"])
    return 1 if failed else 0


def _run_one(args: argparse.Namespace, console: Console, plan: Plan, out: Path, pid: int | None) -> dict[str, Any]:
    if args.timeout is not None:
        plan = Plan(plan.target, plan.profiles, args.timeout)
    live = not args.no_live and console.is_terminal
    if live:
        with Live(console=console, refresh_per_second=4, transient=False) as display:
            result = asyncio.run(run_plan(plan, tick=LiveView(display, plan.seconds), pid=pid, seed=args.seed))
    else:
        result = asyncio.run(run_plan(plan, pid=pid, seed=args.seed))
    summary = write_outputs(result, out)
    if _memory_note(result, summary):
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if not args.no_charts:
        from ratekeeper.loadtest.charts import write_charts

        write_charts(result, summary, out)
    print_summary(summary, console)
    if "rss_growth_bytes" in summary:
        console.print(
            f"server RSS: {summary['rss_first_bytes'] / 2**20:.1f} MiB at the start, "
            f"{summary['rss_halfway_bytes'] / 2**20:.1f} MiB halfway, "
            f"{summary['rss_last_bytes'] / 2**20:.1f} MiB at the end"
        )
    console.print(f"results in {out}/")
    return summary


def _memory_note(result: RunResult, summary: dict[str, Any]) -> bool:
    """Adds the server's RSS at the start and the end to ``summary``, when it was sampled."""
    if len(result.rss) < 2:
        return False
    summary["rss_first_bytes"] = result.rss[0][1]
    # Halfway: a flood's working set is built by then, so growth after it is what a leak shows.
    summary["rss_halfway_bytes"] = result.rss[len(result.rss) // 2][1]
    summary["rss_last_bytes"] = result.rss[-1][1]
    summary["rss_growth_bytes"] = result.rss[-1][1] - result.rss[0][1]
    return True


def _trials_table(results: list[dict[str, Any]]) -> Table:
    table = Table(title="admitted per trial, against the bound")
    table.add_column("profile")
    for i in range(len(results)):
        table.add_column(f"trial {i + 1}", justify="right")
    table.add_column("verdict")
    for index, entry in enumerate(results[0]["profiles"]):
        cells = []
        verdicts = []
        for s in results:
            e = s["profiles"][index]
            cells.append(f"{e['allowed']}/{e['bound']}" if "bound" in e else str(e["allowed"]))
            verdicts.append(verdict(e))
        worst = next((v for v in verdicts if v.startswith("FAIL")), verdicts[0])
        table.add_row(entry["profile"], *cells, worst)
    return table
