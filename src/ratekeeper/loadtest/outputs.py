"""What a run leaves in ``--out DIR``: results.tsv (one row per profile per second),
summary.json, one HDR histogram log per profile (mergeable across runs with any HdrHistogram
log tool), and the summary table with a verdict per profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hdrh.log import HistogramLogWriter  # type: ignore[import-untyped]
from rich.console import Console
from rich.table import Table

from ratekeeper.loadtest.engine import RunResult

__all__ = ["COLUMNS", "summarize", "summary_table", "write_outputs"]

COLUMNS = ("profile", "second", "sent", "allowed", "denied", "errors", "late", "p50_ms", "p90_ms", "p99_ms", "max_ms")


def summarize(result: RunResult) -> dict[str, Any]:
    profiles = []
    for p in result.plan.profiles:
        stats = result.stats[p.name]
        entry = stats.summary(p.bound(stats.span()))
        if p.expect is not None:
            entry["expect"] = str(p.expect)
        entry["control"] = p.control
        profiles.append(entry)
    return {
        "target": result.plan.target,
        "started": result.started,
        "elapsed_s": round(result.elapsed, 3),
        "warnings": result.warnings,
        "profiles": profiles,
        "rss_bytes": [{"t": round(t, 3), "bytes": b} for t, b in result.rss],
    }


def write_outputs(result: RunResult, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "results.tsv").open("w") as f:
        f.write("\t".join(COLUMNS) + "\n")
        for p in result.plan.profiles:
            stats = result.stats[p.name]
            for index in sorted(stats.seconds):
                row = stats.seconds[index].row()
                f.write("\t".join([p.name, str(index), *(f"{row[c]:g}" for c in COLUMNS[2:])]) + "\n")
    summary = summarize(result)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    hdr = out / "hdr"
    hdr.mkdir(exist_ok=True)
    for p in result.plan.profiles:
        with (hdr / f"{_file_name(p.name)}.hlog").open("w") as f:
            writer = HistogramLogWriter(f)
            writer.output_comment(f"ratekeeper loadtest, profile {p.name}, latency in microseconds")
            # hdrh's output_start_time is broken (it reads milliseconds as seconds): the
            # same line, in the format HdrHistogram's log readers expect, is written here.
            # To the microsecond, as the interval line's own timestamp: a reader skips an
            # interval that seems to start before the log.
            f.write(f"#[StartTime: {result.started:.6f} (seconds since epoch)]\n")
            writer.output_legend()
            histogram = result.stats[p.name].histogram
            histogram.set_tag(_file_name(p.name))
            # Values in microseconds; the interval's max column in milliseconds.
            writer.output_interval_histogram(
                histogram, result.started, result.started + result.elapsed, max_value_unit_ratio=1000.0
            )
    return summary


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def verdict(entry: dict[str, Any]) -> str:
    if "bound" not in entry:
        return "no limit expected"
    if entry["allowed"] > entry["bound"]:
        return "FAIL: admitted more than the bound"
    return "ok"


def summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"ratekeeper loadtest: {summary['target']}, {summary['elapsed_s']:.1f} s")
    for column in ("profile", "sent", "allowed", "denied", "errors", "late", "p50 ms", "p99 ms", "max ms", "bound"):
        table.add_column(column, justify="left" if column == "profile" else "right")
    table.add_column("verdict")
    for e in summary["profiles"]:
        lat = e["latency_ms"]
        name = e["profile"] + (" (control)" if e.get("control") and "control" not in e["profile"] else "")
        bound = f"{e['bound']} ({e['expect']})" if "bound" in e else "-"
        table.add_row(
            name, str(e["sent"]), str(e["allowed"]), str(e["denied"]), str(e["errors"]), str(e["late"]),
            f"{lat['p50_ms']:.2f}", f"{lat['p99_ms']:.2f}", f"{lat['max_ms']:.2f}", bound, verdict(e),
        )  # fmt: skip
    return table


def print_summary(summary: dict[str, Any], console: Console) -> None:
    console.print(summary_table(summary))
    for warning in summary["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {warning}")
