"""What a run shows: admitted against the bound per user and in total, errors, latency, the chart."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from load import Sample

WINDOW = 2.0  # rules.yaml's items.list: one request per 2 s per user
LATE_AFTER = 0.05  # a send that left this much after its time is reported as late


def bound(span: float) -> int:
    """The most one user can be admitted over ``span`` seconds of sends: 1 + floor(span / 2)."""
    return 1 + math.floor(span / WINDOW)


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p90, p99, max and mean in milliseconds (nearest rank), or {} for no values."""
    if not values:
        return {}
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))] * 1000

    return {
        "p50_ms": rank(50),
        "p90_ms": rank(90),
        "p99_ms": rank(99),
        "max_ms": ordered[-1] * 1000,
        "mean_ms": sum(ordered) / len(ordered) * 1000,
    }


def per_user(samples: list[Sample]) -> dict[str, dict[str, Any]]:
    """Both instances' limited requests per user: sent, admitted, denied, errors, span, bound."""
    users: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.route == "limited":
            users[s.user].append(s)
    table = {}
    for user, mine in sorted(users.items()):
        admitted = sum(s.status == 200 for s in mine)
        denied = sum(s.status == 429 for s in mine)
        # The server admitted each request somewhere between its send and its answer, so the
        # admissions of this user lie within [first send, last answer]: the bound over that
        # span holds whatever the latency (a bound over the sends alone would not, since a
        # request sent late in the run may arrive seconds later on a loaded machine).
        span = max(s.intended + s.latency for s in mine) - min(s.sent for s in mine)
        table[user] = {
            "sent": len(mine),
            "admitted": admitted,
            "denied": denied,
            "errors": len(mine) - admitted - denied,
            "span_s": round(span, 3),
            "bound": bound(span),
        }
    return table


def summarize(samples: list[Sample], run_seconds: float) -> dict[str, Any]:
    users = per_user(samples)
    limited = [s for s in samples if s.route == "limited"]
    floor = [s for s in samples if s.route == "floor"]
    total = {k: sum(u[k] for u in users.values()) for k in ("sent", "admitted", "denied", "errors", "bound")}
    total["floor_sent"] = len(floor)
    total["floor_errors"] = sum(s.status != 200 for s in floor)
    total["late"] = sum(s.sent - s.intended > LATE_AFTER for s in samples)
    latency: dict[str, Any] = {
        "limited_all": percentiles([s.latency for s in limited]),
        "limited_admitted": percentiles([s.latency for s in limited if s.status == 200]),
        "limited_refused": percentiles([s.latency for s in limited if s.status == 429]),
        "floor_unlimited": percentiles([s.latency for s in floor]),
    }
    if latency["limited_all"] and latency["floor_unlimited"]:
        latency["limiter_added_p50_ms"] = latency["limited_all"]["p50_ms"] - latency["floor_unlimited"]["p50_ms"]
        latency["limiter_added_p99_ms"] = latency["limited_all"]["p99_ms"] - latency["floor_unlimited"]["p99_ms"]
    above = [u for u, row in users.items() if row["admitted"] > row["bound"]]
    exact = [u for u, row in users.items() if row["admitted"] == row["bound"]]
    return {
        "run_seconds": run_seconds,
        "users": users,
        "total": total,
        "latency": latency,
        "users_above_bound": above,
        "users_at_bound": exact,
    }


def print_report(summary: dict[str, Any], pg: dict[str, Any] | None) -> None:
    print(f"\n{'user':<12}{'sent':>8}{'admitted':>10}{'bound':>7}{'denied':>8}{'errors':>8}{'span s':>9}")
    rows = [*summary["users"].items(), ("TOTAL", summary["total"])]
    for user, row in rows:
        span = f"{row['span_s']:9.2f}" if "span_s" in row else " " * 9
        print(
            f"{user:<12}{row['sent']:>8}{row['admitted']:>10}{row['bound']:>7}{row['denied']:>8}{row['errors']:>8}{span}"
        )
    t = summary["total"]
    print(f"floor route: {t['floor_sent']} requests, {t['floor_errors']} errors; late sends (>50 ms): {t['late']}")
    print("\nlatency from the intended send time, ms:")
    for name, p in summary["latency"].items():
        if isinstance(p, dict) and p:
            print(f"  {name:<18}" + "  ".join(f"{k[:-3]} {v:7.2f}" for k, v in p.items()))
    if "limiter_added_p50_ms" in summary["latency"]:
        lat = summary["latency"]
        added = f"{lat['limiter_added_p50_ms']:.2f} ms at p50, {lat['limiter_added_p99_ms']:.2f} ms at p99"
        print(f"  the limited route minus the unlimited one: {added}")
    if pg is not None:
        print(
            f"\nPostgreSQL: deadlocks {pg['deadlocks_before']} -> {pg['deadlocks_after']}"
            f" (moved {pg['deadlocks_moved']});"
            f" lock waits of this run's connections in {pg['samples_with_our_lock_waits']} of {pg['lock_samples']}"
            f" samples, the longest {pg['longest_lock_wait_ms']:.1f} ms (deadlock_timeout"
            f" {pg['deadlock_timeout_ms']:.0f} ms); ungranted locks anywhere in the database in"
            f" {pg['samples_with_ungranted_locks_in_db']}"
        )


def chart(samples: list[Sample], phases: list[tuple[float, float]], path: Path) -> None:
    """Admitted against the bound over time (both instances, every user), and the load below."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server or in CI
    import matplotlib.pyplot as plt

    limited = sorted((s for s in samples if s.route == "limited"), key=lambda s: s.sent)
    end = max(s.sent for s in limited)
    first: dict[str, float] = {}
    for s in limited:
        first.setdefault(s.user, s.sent)
    steps = [i * 0.05 for i in range(int(end / 0.05) + 2)]
    bounds = [sum(bound(t - f) for f in first.values() if t >= f) for t in steps]
    admitted_times = [s.sent for s in limited if s.status == 200]
    seconds = range(math.ceil(end) + 1)
    sent_per_s = [0] * len(seconds)
    ok_per_s = [0] * len(seconds)
    for s in limited:
        sent_per_s[int(s.sent)] += 1
        ok_per_s[int(s.sent)] += s.status == 200

    fig, (top, low) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, height_ratios=[3, 2])
    top.step(steps, bounds, where="post", color="black", linestyle="--", label="bound: 1 + floor(t / 2 s) per user")
    top.step(admitted_times, range(1, len(admitted_times) + 1), where="post", color="tab:green", label="admitted")
    top.set_ylabel("requests admitted (all users)")
    top.set_title(f"GET /items/{{user}}, 1 per 2 s per user: {len(first)} users, two instances, one store")
    top.legend(loc="upper left")
    low.bar(list(seconds), sent_per_s, width=1.0, align="edge", color="tab:blue", alpha=0.4, label="sent / s")
    low.bar(list(seconds), ok_per_s, width=1.0, align="edge", color="tab:green", label="admitted / s")
    low.set_yscale("symlog")
    low.set_xlabel("seconds")
    low.set_ylabel("requests / s (both instances)")
    low.legend(loc="upper left")
    start = 0.0
    for _, length in phases[:-1]:
        start += length
        for ax in (top, low):
            ax.axvline(start, color="grey", linewidth=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
