"""What a profile saw: counts per second, latencies per second (exact percentiles of a
second's few hundred samples) and a full HDR histogram of the run (microseconds)."""

from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

__all__ = ["PERCENTILES", "ProfileStats", "Second", "percentile"]

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
HIGHEST_US = 3_600_000_000
"""The largest latency the histograms hold: an hour, far above any request timeout."""


def percentile(sorted_values: array[float], pct: float) -> float:
    """The nearest-rank percentile of ascending values (0 when there are none)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(slots=True)
class Second:
    """One second of a profile, by intended send time."""

    sent: int = 0
    allowed: int = 0
    denied: int = 0
    errors: int = 0
    late: int = 0
    latencies_ms: array[float] = field(default_factory=lambda: array("d"))

    def row(self) -> dict[str, float]:
        ordered = array("d", sorted(self.latencies_ms))
        return {
            "sent": self.sent,
            "allowed": self.allowed,
            "denied": self.denied,
            "errors": self.errors,
            "late": self.late,
            "p50_ms": round(percentile(ordered, 50), 3),
            "p90_ms": round(percentile(ordered, 90), 3),
            "p99_ms": round(percentile(ordered, 99), 3),
            "max_ms": round(ordered[-1], 3) if ordered else 0.0,
        }


class ProfileStats:
    """Everything recorded for one profile."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seconds: dict[int, Second] = {}
        self.histogram = HdrHistogram(1, HIGHEST_US, 3)
        self.statuses: Counter[str] = Counter()
        self.first_send: float | None = None
        self.last_answer: float | None = None
        self.planned = 0

    def second(self, index: int) -> Second:
        s = self.seconds.get(index)
        if s is None:
            s = self.seconds[index] = Second()
        return s

    def totals(self) -> dict[str, int]:
        keys = ("sent", "allowed", "denied", "errors", "late")
        return {k: sum(getattr(s, k) for s in self.seconds.values()) for k in keys}

    def latency_ms(self) -> dict[str, float]:
        h = self.histogram
        out = {f"p{p:g}_ms": h.get_value_at_percentile(p) / 1000 for p in PERCENTILES}
        out["max_ms"] = h.get_max_value() / 1000
        out["mean_ms"] = round(h.get_mean_value() / 1000, 3)
        return out

    def recent_p99_ms(self, seconds: int, now_index: int) -> float:
        values: list[float] = []
        for i in range(now_index - seconds, now_index + 1):
            s = self.seconds.get(i)
            if s is not None:
                values.extend(s.latencies_ms)
        values.sort()
        return percentile(array("d", values), 99)

    def span(self) -> float:
        """Seconds from the first request sent to the last answer: the time in which the
        limiter could have admitted this profile's requests."""
        if self.first_send is None or self.last_answer is None:
            return 0.0
        return self.last_answer - self.first_send

    def summary(self, bound: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {"profile": self.name, "planned": self.planned, **self.totals()}
        out["latency_ms"] = self.latency_ms()
        out["statuses"] = dict(sorted(self.statuses.items()))
        out["span_s"] = round(self.span(), 3)
        if bound is not None:
            out["bound"] = bound
            out["within_bound"] = out["allowed"] <= bound
        return out
