"""``DecisionHistory``: recent decisions per rule, sampled from the service's ``Metrics``.

The decisions counter (``ratekeeper_decisions_total{rule, outcome}``) only ever grows; the
status page wants what happened in each of the last few minutes. Every ``INTERVAL``
seconds the sampler reads the counter once and keeps the per-rule, per-outcome counts in
a ring of ``SAMPLES`` snapshots; the page's charts are the differences between
neighbours. Memory is bounded: the ring has a fixed length and its rules are the
labelled ones (the configured rules, plus ``_other``), never keys.

Reloads are read the same way (``ratekeeper_config_reloads_total{result}``): a change
between two samples is remembered, with its time, among the last ``RELOADS`` seen.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ratekeeper.metrics import Metrics

__all__ = ["INTERVAL", "KINDS", "RELOADS", "SAMPLES", "DecisionHistory", "kind_of"]

INTERVAL = 2.0
"""Seconds between two samples."""

SAMPLES = 151
"""Samples kept: 150 intervals of 2 s, the last five minutes."""

RELOADS = 10
"""Reload results remembered."""

KINDS = ("allowed", "denied", "shadow", "fallback")
"""What the page charts, each a sum of the metrics' outcomes (``kind_of``)."""

_KIND_OF = {"within": "allowed", "near": "allowed", "over": "denied", "shadow_over": "shadow", "fallback": "fallback"}


def kind_of(outcome: str) -> str | None:
    """The chart an outcome of the decisions counter is drawn in (None: an unknown one)."""
    return _KIND_OF.get(outcome)


@dataclass(frozen=True, slots=True)
class Sample:
    """The cumulative counts at one moment: ``rule -> kind -> count``."""

    at: float  # time.time(), for the page's clock
    counts: dict[str, dict[str, int]]


@dataclass(slots=True)
class DecisionHistory:
    """The last ``samples`` samples of ``metrics`` and the last reloads."""

    metrics: Metrics
    interval: float = INTERVAL
    samples: int = SAMPLES
    ring: deque[Sample] = field(init=False)
    reloads: deque[dict[str, Any]] = field(init=False)
    _reload_counts: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.ring = deque(maxlen=self.samples)
        self.reloads = deque(maxlen=RELOADS)
        self._reload_counts = self._read_reloads()

    def sample(self, now: float | None = None) -> None:
        """Read the counters once: one more snapshot, and a reload entry per new result."""
        at = time.time() if now is None else now
        counts: dict[str, dict[str, int]] = {}
        for family in self.metrics.decisions.collect():
            for s in family.samples:
                if not s.name.endswith("_total"):
                    continue  # the _created timestamps
                kind = kind_of(s.labels.get("outcome", ""))
                if kind is None:
                    continue
                per_rule = counts.setdefault(s.labels.get("rule", ""), dict.fromkeys(KINDS, 0))
                per_rule[kind] += int(s.value)
        self.ring.append(Sample(at, counts))
        reloads = self._read_reloads()
        for result in ("ok", "failed"):
            new = reloads.get(result, 0) - self._reload_counts.get(result, 0)
            if new > 0:
                self.reloads.append({"at": at, "result": result, "count": new})
        self._reload_counts = reloads

    def _read_reloads(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for family in self.metrics.reloads.collect():
            for s in family.samples:
                if s.name.endswith("_total"):
                    out[s.labels.get("result", "")] = int(s.value)
        return out

    def series(self) -> dict[str, Any]:
        """What the page charts: the sample times (the end of each interval) and, per rule
        and kind, the decisions in each interval."""
        ring = list(self.ring)
        times = [s.at for s in ring[1:]]
        rules = sorted({rule for s in ring for rule in s.counts})
        per_rule: dict[str, dict[str, list[int]]] = {}
        for rule in rules:
            per_kind: dict[str, list[int]] = {kind: [] for kind in KINDS}
            for before, after in itertools.pairwise(ring):
                b = before.counts.get(rule, {})
                a = after.counts.get(rule, {})
                for kind in KINDS:
                    # max(0, ...): a rule dropped and configured again starts a new series.
                    per_kind[kind].append(max(0, a.get(kind, 0) - b.get(kind, 0)))
            per_rule[rule] = per_kind
        return {"interval": self.interval, "times": times, "rules": per_rule}

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled."""
        while True:
            self.sample()
            await asyncio.sleep(self.interval)
