"""``Metrics``: Prometheus metrics of a limiter, labelled per rule and never per key.

An ``Observer`` (``ratekeeper.limiter.observer``) plus the reports that only the layers
above the limiter know of (shadow rules, skipped requests, reloads, transports)::

    from ratekeeper import Limiter
    from ratekeeper.metrics import Metrics

    metrics = Metrics()                      # its own CollectorRegistry
    limiter = Limiter("redis://cache:6379/0", observer=metrics)
    body, content_type = metrics.exposition()  # what GET /metrics answers

The metrics (``namespace`` is the prefix, ``ratekeeper`` by default):

- ``ratekeeper_decisions_total{rule, outcome}``: each decision that charged or refused.
  ``outcome`` is one of ``OUTCOMES``: ``fallback`` when the failure policy answered
  (``decision.fallback`` is set), else ``shadow_over`` for a refusal of a rule named in
  ``shadow_rules`` (a shadow rule never refuses a request), ``over`` for any other
  refusal, ``near`` for an admission that left some limit at least ``near`` (80 %) used,
  and ``within`` for the other admissions.
- ``ratekeeper_charged_cost_total{rule}``: the cost charged without a check
  (``Limiter.charge``: a cost known after the fact, e.g. a response's size), and
  ``ratekeeper_debt_charges_total{rule}``: those charges that left the key in debt (the
  decision's ``remaining`` below zero). A charge is not counted among the decisions: it
  refuses nothing. One the failure policy refused under ``"deny"`` was not applied and is
  not counted.
- ``ratekeeper_refunded_cost_total{rule}``: the cost the store gave back (``refund``, a
  reservation ``acquire`` returned); not lease releases.
- ``ratekeeper_settle_failures_total{rule}``: responses whose real cost the web
  integrations could not settle (the store failed the charge or refund after the
  response): the request kept what it was charged. Reported through ``settle_failed``.
- ``ratekeeper_store_latency_seconds``: a histogram of every store call.
- ``ratekeeper_store_errors_total{cause}``: failed store calls by the ``StoreError``
  class name (``StoreError``, ``StoreTimeout``, ...).
- ``ratekeeper_breaker_state{state}``: 1 for the circuit breaker's current state
  (``closed``, ``open``, ``half_open``), 0 for the two others.
- ``ratekeeper_config_reloads_total{result}``: reloads of the rules, ``ok`` or ``failed``.
- ``ratekeeper_requests_total{transport}``: requests received, by transport (``http``,
  ``grpc``, ``asgi``, ...).
- ``ratekeeper_decision_latency_seconds{result}``: a histogram of the time one request's
  decision took (its whole transaction: every rule, the store round trips, the failure
  policy), ``result`` ``allowed`` or ``refused``: a refusal may answer from the
  over-limit cache or the open breaker without a round trip, so the two are kept apart.
  Reported by the layer that holds the request (the service's ``/v1/check``, its Envoy
  ``ShouldRateLimit`` and ``/json``, and the web middleware), through ``decision_time``.
- ``ratekeeper_skipped_total{rule}``: requests a rule did not limit because their key
  could not be built (a header or path part was missing).
- ``ratekeeper_rule_limit{rule, limit}`` and ``ratekeeper_rule_limit_period_seconds{rule,
  limit}``: each limit of each configured rule, its count and its period (``limit`` is the
  limit as written, ``"100/minute"``), so an alert can divide a rate of decisions by
  ``rule_limit / rule_limit_period_seconds``: the share of a limit used. A rule of several
  limits has one series per limit; a rule that is no longer configured has none.

- ``ratekeeper_bounded_cache_entries{cache}``, ``ratekeeper_bounded_cache_bound{cache}``
  and ``ratekeeper_bounded_cache_evictions_total{cache}``: the size, the bound and the
  evictions of each table of client-created state given to ``watch_cache`` (e.g. the
  Envoy override rules): evictions that keep rising mean clients churn through the bound.

Label values are rule names, outcome and state names, class names, transports and cache
names, so the series stay few however many keys are limited. A rule name is a label only
when it is a configured rule: the service and the middleware say which rules those are
(``configured_rules``); a rule a client made up (an Envoy ``limit`` override, a rule sent
to the store API) is counted under ``rule="_other"`` (``OTHER_RULE``), so a client cannot
add series by inventing names. Until ``configured_rules`` is called (a limiter whose rules
are written in code), the first ``max_rules`` distinct names are labels and later ones
``_other``.

``otel`` (a ``ratekeeper.otel.OpenTelemetry``) receives every report too, with the labels
computed here: the same instruments through the OpenTelemetry API, and a span per decision.
Only when it records keys (``record_key=True``) does this object ask the limiter for them
(``wants_keys``), to hand them on to its spans; no metric is ever labelled by key.

prometheus-client is imported when a ``Metrics`` is built, not when this module is:
``pip install 'ratekeeper[metrics]'`` when it is missing. All methods are thread-safe and
never block (prometheus-client's counters take a short lock each).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ratekeeper.bounded import BoundedCache
    from ratekeeper.decision import Decision
    from ratekeeper.errors import StoreError
    from ratekeeper.limit import Limit
    from ratekeeper.limiter.overlimit import DenialCache
    from ratekeeper.otel import OpenTelemetry
    from ratekeeper.rule import Rule

__all__ = ["BREAKER_STATES", "OTHER_RULE", "OUTCOMES", "Metrics", "outcome_of"]

OUTCOMES = ("within", "near", "over", "shadow_over", "fallback")
"""The values of the ``outcome`` label of the decisions counter."""

BREAKER_STATES = ("closed", "open", "half_open")
"""The states of the circuit breaker (``ratekeeper.limiter.breaker``), as gauge labels."""

OTHER_RULE = "_other"
"""The ``rule`` label of every rule that is not configured (see the module docstring)."""

MAX_RULES = 1_000
"""Without configured rules, the most distinct rule names that become labels."""

NEAR = 0.8
"""The share of a limit used from which an admission counts as ``near``."""

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
"""Store latency buckets in seconds: an in-process store answers in microseconds, a
Redis or PostgreSQL round trip in a fraction of a millisecond to a few; the top buckets
catch timeouts."""


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "ratekeeper's metrics need prometheus-client: pip install 'ratekeeper[metrics]'",
            name="prometheus_client",
        ) from exc
    return prometheus_client


def outcome_of(decision: Decision, shadow: bool = False, near: float = NEAR) -> str:
    """The ``outcome`` label of one decision (see the module docstring).

    ``near`` compares each limit's used share after the decision, ``1 - remaining /
    capacity`` (capacity is the limit's burst when it has one, else its count), with the
    threshold; the most used limit decides, so a rule of "5/3s" and "20/minute" is near
    once either is.
    """
    if decision.fallback:
        return "fallback"
    if not decision.allowed:
        return "shadow_over" if shadow else "over"
    for limit, remaining in zip(decision.rule_limits, decision.remaining_each, strict=False):
        capacity = limit.capacity
        if capacity > 0 and capacity - remaining >= near * capacity:
            return "near"
    return "within"


class Metrics:
    """Prometheus metrics of one limiter (or several: a middleware's and a service's
    limiters may share one), registered in ``registry``.

    ``registry`` defaults to a new ``CollectorRegistry`` of this object's own, so two
    ``Metrics`` never collide; pass ``prometheus_client.REGISTRY`` to join the process's
    default registry (and the ``/metrics`` endpoint an application already serves).
    ``near`` is the used share from which an admission is counted as ``near``.
    ``max_rules`` bounds the rule labels until ``configured_rules`` names them.
    ``otel`` is told everything this object is told (see the module docstring).
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        namespace: str = "ratekeeper",
        *,
        near: float = NEAR,
        max_rules: int = MAX_RULES,
        otel: OpenTelemetry | None = None,
    ) -> None:
        if not 0 < near <= 1:
            raise ValueError(f"near must be a share of a limit in (0, 1], got {near!r}")
        if type(max_rules) is not int or max_rules < 0:
            raise ValueError(f"max_rules must be an integer of at least 0, got {max_rules!r}")
        prom = _prometheus()
        self._prom = prom
        self.registry: CollectorRegistry = prom.CollectorRegistry() if registry is None else registry
        self.near = near
        self._namespace = namespace
        self._shadow: frozenset[str] = frozenset()
        common: dict[str, Any] = {"namespace": namespace, "registry": self.registry}
        self.decisions = prom.Counter(
            "decisions", "Decisions that charged or refused, per rule and outcome", ["rule", "outcome"], **common
        )
        self.store_latency = prom.Histogram(
            "store_latency_seconds", "Duration of each store call", buckets=LATENCY_BUCKETS, **common
        )
        self.store_errors = prom.Counter(
            "store_errors", "Failed store calls, by the StoreError class raised", ["cause"], **common
        )
        self.breaker_state = prom.Gauge(
            "breaker_state", "1 for the circuit breaker's current state, else 0", ["state"], **common
        )
        self.reloads = prom.Counter("config_reloads", "Reloads of the rules, by result", ["result"], **common)
        self.requests = prom.Counter("requests", "Requests received, by transport", ["transport"], **common)
        self.decision_latency = prom.Histogram(
            "decision_latency_seconds",
            "Time one request's decision took, allowed and refused apart",
            ["result"],
            buckets=LATENCY_BUCKETS,
            **common,
        )
        # Children resolved once: decision_time runs on every request's hot path.
        self._decision_children = {
            True: self.decision_latency.labels("allowed"),
            False: self.decision_latency.labels("refused"),
        }
        self.skips = prom.Counter(
            "skipped", "Requests a rule did not limit: their key could not be built", ["rule"], **common
        )
        self.rule_limit = prom.Gauge(
            "rule_limit", "The count of each limit of a configured rule", ["rule", "limit"], **common
        )
        self.rule_limit_period = prom.Gauge(
            "rule_limit_period_seconds", "The period of each limit of a configured rule", ["rule", "limit"], **common
        )
        self.charged_cost = prom.Counter(
            "charged_cost", "Cost charged without a check (a cost known after the fact), per rule", ["rule"], **common
        )
        self.debt_charges = prom.Counter(
            "debt_charges", "Charges without a check that left the key in debt, per rule", ["rule"], **common
        )
        self.refunded_cost = prom.Counter(
            "refunded_cost", "Cost the store gave back (refunds, returned reservations), per rule", ["rule"], **common
        )
        self.settle_failures = prom.Counter(
            "settle_failures",
            "Responses whose real cost could not be settled (the store failed), per rule",
            ["rule"],
            **common,
        )
        self.otel = otel
        # Keys are asked of the limiter only for spans that record them (read when the
        # limiter is built: ratekeeper.limiter.observer).
        self.wants_keys: bool = otel is not None and otel.records_keys
        for state in BREAKER_STATES:
            self.breaker_state.labels(state).set(1 if state == "closed" else 0)
        for result in ("ok", "failed"):
            self.reloads.labels(result)  # both series exist from the start: rate() sees the first failure
        # The labelled children, resolved once per (rule, outcome): ``labels()`` costs a
        # lock and a tuple per call. Only labelled rules are kept here (bounded by the
        # configuration or ``max_rules``); an unlabelled one resolves through ``_label``.
        self._children: dict[tuple[str, str], Any] = {}
        self._charge_children: dict[str, tuple[str, Any, Any]] = {}  # rule -> (label, charged, debt)
        self._refund_children: dict[str, tuple[str, Any]] = {}  # rule -> (label, refunded)
        self._max_rules = max_rules
        self._configured: frozenset[str] | None = None
        self._configured_by: dict[str, frozenset[str]] = {}
        self._limits_by: dict[str, dict[str, tuple[Limit, ...]]] = {}
        self._limit_series: set[tuple[str, str]] = set()
        self._seen: set[str] = set()  # the names labelled so far while none is configured
        self._lock = threading.Lock()
        self._caches: dict[str, BoundedCache[Any, Any]] = {}
        self._caches_collector: Any = None

    # -- the Observer protocol ---------------------------------------------------------

    def decided(self, decision: Decision, key: str | None = None) -> None:
        """Count one decision under its rule and outcome (``key`` goes to the spans of an
        ``otel`` that records keys, and nowhere else)."""
        rule = decision.rule
        outcome = outcome_of(decision, rule in self._shadow, self.near)
        children = self._children
        child = children.get((rule, outcome))
        label = rule
        if child is None:
            label = self._label(rule)
            child = self.decisions.labels(label, outcome)
            if label == rule:
                children[(rule, outcome)] = child
        child.inc()
        if self.otel is not None:
            self.otel.decided(decision, label, outcome, key)

    def charged(self, decision: Decision, cost: int, key: str | None = None) -> None:
        """Count one charge without a check: its cost, and whether it left the key in debt."""
        rule = decision.rule
        # Read once, as ``decided`` reads ``_children``: a child made while
        # ``configured_rules`` swaps in a new dict goes to the old one, not the new.
        cache = self._charge_children
        found = cache.get(rule)
        if found is None:
            label = self._label(rule)
            found = (label, self.charged_cost.labels(label), self.debt_charges.labels(label))
            if label == rule:  # only configured (bounded) names are kept
                cache[rule] = found
        label, charged, debt = found
        applied = bool(decision.allowed)  # refused: the "deny" failure policy dropped it
        in_debt = applied and decision.remaining < 0
        if applied:
            charged.inc(cost)
            if in_debt:
                debt.inc()
        if self.otel is not None:
            self.otel.charged(decision, label, cost, in_debt, key)

    def refunded(self, rule: str, cost: int) -> None:
        """Count ``cost`` the store gave back to a key of ``rule``."""
        cache = self._refund_children  # read once, as in ``charged``
        found = cache.get(rule)
        if found is None:
            label = self._label(rule)
            found = (label, self.refunded_cost.labels(label))
            if label == rule:
                cache[rule] = found
        label, refunded = found
        refunded.inc(cost)
        if self.otel is not None:
            self.otel.refunded(label, cost)

    def store_call(self, seconds: float, error: StoreError | None) -> None:
        """Observe one store call's duration; count its error by class name."""
        self.store_latency.observe(seconds)
        if error is not None:
            self.store_errors.labels(type(error).__name__).inc()
        if self.otel is not None:
            self.otel.store_call(seconds, error)

    def breaker_changed(self, old: str, new: str) -> None:
        """Move the breaker gauge to ``new``."""
        self.breaker_state.labels(old).set(0)
        self.breaker_state.labels(new).set(1)
        if self.otel is not None:
            self.otel.breaker_changed(old, new)

    # -- what the layers above the limiter report --------------------------------------

    def shadow_rules(self, names: Iterable[str]) -> None:
        """The rules in shadow mode from now on (replacing the previous set): their
        refusals count as ``shadow_over``."""
        self._shadow = frozenset(names)

    def configured_rules(self, rules: Iterable[str | Rule], source: str = "") -> None:
        """The configured rules of ``source`` from now on (replacing that source's previous
        set), each a name or a ``Rule``: only the names of every source are ``rule``
        labels; any other rule is counted under ``OTHER_RULE``. A ``Rule``'s limits become
        the ``rule_limit`` gauges. The service calls it with each catalog it loads, each
        middleware with its rules (one ``Metrics`` may serve a middleware and a FastAPI
        dependency, each a source of its own)."""
        names: set[str] = set()
        limits: dict[str, tuple[Limit, ...]] = {}
        for rule in rules:
            if isinstance(rule, str):
                names.add(rule)
            else:
                names.add(rule.name)
                limits[rule.name] = rule.limits
        with self._lock:
            self._configured_by[source] = frozenset(names)
            self._configured = frozenset().union(*self._configured_by.values())
            self._seen.clear()
            # A rule no longer configured must stop resolving to its own series.
            self._children = {}
            self._charge_children = {}
            self._refund_children = {}
            self._limits_by[source] = limits
            merged = {name: ls for by_source in self._limits_by.values() for name, ls in by_source.items()}
            self._set_limits(merged)
        if self.otel is not None:
            self.otel.rule_limits(merged)

    def _set_limits(self, limits: dict[str, tuple[Limit, ...]]) -> None:
        """Make the ``rule_limit`` gauges hold ``limits`` and nothing else."""
        series = {(name, str(limit)): limit for name, ls in limits.items() for limit in ls}
        for gone in self._limit_series - series.keys():
            self.rule_limit.remove(*gone)
            self.rule_limit_period.remove(*gone)
        for labels, limit in series.items():
            self.rule_limit.labels(*labels).set(limit.count)
            self.rule_limit_period.labels(*labels).set(limit.period)
        self._limit_series = set(series)

    def _label(self, rule: str) -> str:
        """The ``rule`` label of ``rule``: itself when configured, else ``OTHER_RULE``."""
        configured = self._configured
        if configured is not None:
            return rule if rule in configured else OTHER_RULE
        with self._lock:
            if rule in self._seen:
                return rule
            if len(self._seen) < self._max_rules:
                self._seen.add(rule)
                return rule
        return OTHER_RULE

    def settle_failed(self, rule: str) -> None:
        """A response's real cost under ``rule`` could not be settled (the web integrations)."""
        label = self._label(rule)
        self.settle_failures.labels(label).inc()
        if self.otel is not None:
            self.otel.settle_failed(label)

    def skipped(self, rule: str) -> None:
        """A request ``rule`` did not limit because its key could not be built."""
        label = self._label(rule)
        self.skips.labels(label).inc()
        if self.otel is not None:
            self.otel.skipped(label)

    def reloaded(self, ok: bool) -> None:
        """A reload of the rules: accepted (``ok``) or refused."""
        self.reloads.labels("ok" if ok else "failed").inc()
        if self.otel is not None:
            self.otel.reloaded(ok)

    def decision_time(self, seconds: float, allowed: bool) -> None:
        """One request's decision took ``seconds`` and admitted it (``allowed``) or not."""
        self._decision_children[allowed].observe(seconds)
        if self.otel is not None:
            self.otel.decision_time(seconds, allowed)

    def request(self, transport: str) -> None:
        """One request received over ``transport`` (``http``, ``grpc``, ...)."""
        self.requests.labels(transport).inc()
        if self.otel is not None:
            self.otel.request(transport)

    def request_counter(self, transport: str) -> Callable[[], None]:
        """The quickest way to count requests of one ``transport`` (``request(transport)``
        bound once), for a server's per-request path."""
        count: Callable[[], None] = self.requests.labels(transport).inc
        otel = self.otel
        if otel is None:
            return count

        def count_both() -> None:
            count()
            otel.request(transport)

        return count_both

    # -- reading -----------------------------------------------------------------------

    def watch_over_limit_cache(self, cache: DenialCache) -> None:
        """Export ``cache``'s counts: ``over_limit_cache_hits`` (refusals answered without a
        store round trip) and ``over_limit_cache_stored`` (denials remembered). Its hits are
        also counted among the decisions (outcome ``over``), as the limiter reports them."""
        from prometheus_client.core import CounterMetricFamily

        namespace = self._namespace

        class _CacheCollector:
            def collect(self) -> Iterator[Any]:
                hits = CounterMetricFamily(
                    f"{namespace}_over_limit_cache_hits", "Refusals answered by the over-limit cache"
                )
                hits.add_metric([], cache.hits)
                stored = CounterMetricFamily(
                    f"{namespace}_over_limit_cache_stored", "Denials the over-limit cache remembered"
                )
                stored.add_metric([], cache.stored)
                yield hits
                yield stored

        self.registry.register(_CacheCollector())

    def watch_cache(self, name: str, cache: BoundedCache[Any, Any]) -> None:
        """Export ``cache``'s size, bound and evictions under ``cache=name``:
        ``bounded_cache_entries``, ``bounded_cache_bound`` and ``bounded_cache_evictions``.
        Watching another cache under a name already watched replaces it."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        namespace = self._namespace
        caches = self._caches

        class _BoundedCachesCollector:
            def collect(self) -> Iterator[Any]:
                entries = GaugeMetricFamily(
                    f"{namespace}_bounded_cache_entries",
                    "Entries held by a cache of client-created state",
                    labels=["cache"],
                )
                bound = GaugeMetricFamily(
                    f"{namespace}_bounded_cache_bound",
                    "The most entries a cache of client-created state holds",
                    labels=["cache"],
                )
                evictions = CounterMetricFamily(
                    f"{namespace}_bounded_cache_evictions",
                    "Entries evicted (least recently used first) to keep a cache within its bound",
                    labels=["cache"],
                )
                for cache_name, watched in sorted(caches.items()):
                    entries.add_metric([cache_name], len(watched))
                    bound.add_metric([cache_name], watched.bound)
                    evictions.add_metric([cache_name], watched.evictions)
                yield entries
                yield bound
                yield evictions

        with self._lock:
            caches[name] = cache
            if self._caches_collector is None:
                self._caches_collector = _BoundedCachesCollector()
                self.registry.register(self._caches_collector)

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The registry in the text format, and its content type: the body of ``/metrics``.

        ``accept`` is the scraper's ``Accept`` header: the OpenMetrics format is answered
        when it asks for it, Prometheus's text format 0.0.4 otherwise.
        """
        encoder, content_type = self._prom.exposition.choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def value(self, name: str, **labels: str) -> float | None:
        """The current value of one sample (``name`` with the namespace, e.g.
        ``"ratekeeper_decisions_total"``), or None when it does not exist."""
        result: float | None = self.registry.get_sample_value(name, labels)
        return result
