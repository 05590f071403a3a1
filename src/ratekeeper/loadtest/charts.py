"""The PNG charts of a run, drawn with matplotlib's Agg backend (no display needed):
rates.png, latencies.png and, when the server's memory was sampled, memory.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, no GUI toolkit
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from ratekeeper.loadtest.engine import RunResult

__all__ = ["write_charts"]


def write_charts(result: RunResult, summary: dict[str, Any], out: Path) -> list[Path]:
    written = [_rates(result, out / "rates.png"), _latencies(summary, out / "latencies.png")]
    if result.rss:
        written.append(_memory(result, out / "memory.png"))
    return written


def _rates(result: RunResult, path: Path) -> Path:
    profiles = result.plan.profiles
    fig, axes = plt.subplots(len(profiles), 1, figsize=(9, 2.2 * len(profiles) + 0.6), sharex=True, squeeze=False)
    for ax, p in zip(axes[:, 0], profiles, strict=True):
        seconds = result.stats[p.name].seconds
        xs = sorted(seconds)
        ax.plot(xs, [seconds[x].allowed for x in xs], label="allowed/s", color="tab:green")
        ax.plot(xs, [seconds[x].denied for x in xs], label="denied/s", color="tab:red")
        if any(seconds[x].errors for x in xs):
            ax.plot(xs, [seconds[x].errors for x in xs], label="errors/s", color="tab:gray")
        if p.expect is not None:
            # The limit's sustained rate; its burst shows as the first second above the line.
            ax.axhline(p.expect.count / p.expect.period, linestyle="--", color="black", label=f"limit {p.expect}")
        ax.set_title(_label(p.name, p.control), fontsize=9, loc="left")
        ax.set_ylabel("requests/s")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("second of the run")
    return _save(fig, path)


def _latencies(summary: dict[str, Any], path: Path) -> Path:
    entries = summary["profiles"]
    keys = ("p50_ms", "p90_ms", "p99_ms", "max_ms")
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(keys)
    for k, key in enumerate(keys):
        xs = [i + k * width for i in range(len(entries))]
        ax.bar(xs, [max(e["latency_ms"][key], 1e-3) for e in entries], width, label=key.removesuffix("_ms"))
    control = [e for e in entries if e.get("control")]
    if control:
        ax.axhline(control[0]["latency_ms"]["p99_ms"], linestyle="--", color="black", label="control p99")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(entries))])
    ax.set_xticklabels([_label(e["profile"], e.get("control", False)) for e in entries], fontsize=8, rotation=15)
    ax.set_yscale("log")
    ax.set_ylabel("latency from intended send, ms (log)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` to ``path`` and free it (pyplot keeps every open figure)."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _label(name: str, control: bool) -> str:
    return f"{name} (control)" if control and "control" not in name else name


def _memory(result: RunResult, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.plot([t for t, _ in result.rss], [b / 2**20 for _, b in result.rss], color="tab:blue")
    ax.set_xlabel("second of the run")
    ax.set_ylabel("server RSS, MiB")
    ax.set_ylim(bottom=0)
    return _save(fig, path)
