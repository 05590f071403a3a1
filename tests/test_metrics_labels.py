"""Metrics labels come only from configured rules; any other name is ``rule="_other"``;
the tables of client-created state (``BoundedCache``) export their size, bound and evictions."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ratekeeper import Limiter, Rule
from ratekeeper.bounded import BoundedCache
from ratekeeper.metrics import OTHER_RULE, Metrics
from ratekeeper.testing import FakeClock

DECISIONS = "ratekeeper_decisions_total"


def rule_labels(metrics: Metrics) -> set[str]:
    """Every ``rule`` label value in the text exposition."""
    body, _ = metrics.exposition()
    return {
        s.labels["rule"]
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if "rule" in s.labels
    }


def test_only_configured_rules_are_labels_the_others_count_under_other() -> None:
    metrics = Metrics()
    metrics.configured_rules(["api"])
    limiter = Limiter("memory://", clock=FakeClock(), observer=metrics)
    limiter.try_acquire(Rule("api", ["10/minute"]), "k")
    for n in range(500):  # names a client made up, e.g. Envoy overrides
        limiter.try_acquire(Rule(f"d.override.{n + 10}_per_second", [f"{n + 10}/s"]), "k")
    metrics.skipped("made.up")
    assert rule_labels(metrics) == {"api", OTHER_RULE}
    assert metrics.value(DECISIONS, rule="api", outcome="within") == 1
    assert metrics.value(DECISIONS, rule=OTHER_RULE, outcome="within") == 500
    assert metrics.value("ratekeeper_skipped_total", rule=OTHER_RULE) == 1
    assert len(metrics._children) <= 5  # one per outcome of "api", never one per made-up name


def test_a_reload_that_drops_a_rule_moves_its_later_decisions_to_other() -> None:
    metrics = Metrics()
    metrics.configured_rules(["a", "b"])
    limiter = Limiter("memory://", clock=FakeClock(), observer=metrics)
    a = Rule("a", ["10/minute"])
    limiter.try_acquire(a, "k")
    metrics.configured_rules(["b"])
    limiter.try_acquire(a, "k")
    assert metrics.value(DECISIONS, rule="a", outcome="within") == 1
    assert metrics.value(DECISIONS, rule=OTHER_RULE, outcome="within") == 1


def test_without_configured_rules_the_labels_stop_at_max_rules() -> None:
    metrics = Metrics(max_rules=3)
    limiter = Limiter("memory://", clock=FakeClock(), observer=metrics)
    for n in range(10):
        limiter.try_acquire(Rule(f"r{n}", ["10/minute"]), "k")
    limiter.try_acquire(Rule("r0", ["10/minute"]), "k2")  # a name already labelled keeps its label
    assert rule_labels(metrics) == {"r0", "r1", "r2", OTHER_RULE}
    assert metrics.value(DECISIONS, rule="r0", outcome="within") == 2
    assert metrics.value(DECISIONS, rule=OTHER_RULE, outcome="within") == 7


def test_max_rules_must_be_a_count() -> None:
    with pytest.raises(ValueError, match="max_rules must be an integer of at least 0, got -1"):
        Metrics(max_rules=-1)


def test_a_watched_cache_exports_its_size_bound_and_evictions() -> None:
    metrics = Metrics()
    cache: BoundedCache[int, int] = BoundedCache(3)
    metrics.watch_cache("envoy_overrides", cache)
    metrics.watch_cache("other", BoundedCache(7))
    for n in range(5):
        cache.get(n, lambda: 0)
    labels = {"cache": "envoy_overrides"}
    assert metrics.value("ratekeeper_bounded_cache_entries", **labels) == 3
    assert metrics.value("ratekeeper_bounded_cache_bound", **labels) == 3
    assert metrics.value("ratekeeper_bounded_cache_evictions_total", **labels) == 2
    assert metrics.value("ratekeeper_bounded_cache_bound", cache="other") == 7
