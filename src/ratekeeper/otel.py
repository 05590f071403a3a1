"""``OpenTelemetry``: ratekeeper's metrics through the OpenTelemetry API, and a span per
decision.

It is a backend of ``ratekeeper.metrics.Metrics``, which computes every label once and
tells it each report, so the Prometheus metrics and these are one layer::

    from ratekeeper.metrics import Metrics
    from ratekeeper.otel import OpenTelemetry

    metrics = Metrics(otel=OpenTelemetry())   # the global meter and tracer providers
    limiter = Limiter("redis://cache:6379/0", observer=metrics)

The instruments are the Prometheus metrics of ``ratekeeper.metrics``, named so that an
OpenTelemetry Prometheus exporter gives the same names back (``namespace`` is the prefix):

- ``ratekeeper.decisions`` (counter; ``rule``, ``outcome``)
- ``ratekeeper.charged_cost``, ``ratekeeper.debt_charges`` and ``ratekeeper.refunded_cost``
  (counters; ``rule``): the cost charged without a check, the charges that left a key in
  debt, the cost given back; ``ratekeeper.settle_failures`` (counter; ``rule``)
- ``ratekeeper.store_latency`` (histogram, seconds), ``ratekeeper.store_errors`` (counter;
  ``cause``)
- ``ratekeeper.breaker_state`` (gauge; ``state``: 1 for the current state, else 0)
- ``ratekeeper.config_reloads`` (counter; ``result``), ``ratekeeper.requests`` (counter;
  ``transport``), ``ratekeeper.skipped`` (counter; ``rule``)
- ``ratekeeper.decision_latency`` (histogram, seconds; ``result``)
- ``ratekeeper.rule_limit`` and ``ratekeeper.rule_limit_period`` (gauges, the second in
  seconds; ``rule``, ``limit``): each limit of each configured rule

Each decision the limiter reports is a span ``ratekeeper.decision`` (a child of the span
current where the decision was made, e.g. the request's), with the attributes
``ratekeeper.rule``, ``ratekeeper.outcome``, ``ratekeeper.allowed``,
``ratekeeper.remaining``, ``ratekeeper.denied_by`` (the limit that refused),
``ratekeeper.fallback`` (the failure policy that answered) and, for the decision that a
store call answered, ``ratekeeper.store.latency`` (seconds; the span starts when that call
did) and ``ratekeeper.store.error`` (the ``StoreError`` class when it failed). A store call
that answers several rules at once (every rule of one request) gives its latency to the
first decision's span only. Each charge without a check (``Limiter.charge``) is a span
``ratekeeper.charge`` alike, with ``ratekeeper.cost`` and ``ratekeeper.debt`` (whether it
left the key in debt) in place of the outcome.

The key is not an attribute unless asked: with ``record_key=True`` (and spans), the
spans carry ``ratekeeper.key``, the key cut to its first ``MAX_KEY_LENGTH`` (128)
characters (``ratekeeper.key_truncated`` is then true), so a client's long key costs a
trace backend a bounded attribute. Keys identify clients (user ids, IP addresses, API
keys): record them only where the traces may hold that. Without it the limiter does not
even pass keys to its observer. Metrics never carry a key.

Only ``opentelemetry-api`` is imported (``pip install 'ratekeeper[otel]'``); what exports
is the application's SDK, or ``from_environment`` for ``ratekeeper serve --otel``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import ConfigurationError
from ratekeeper.metrics import BREAKER_STATES, LATENCY_BUCKETS

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.errors import StoreError
    from ratekeeper.limit import Limit

__all__ = ["CHARGE_SPAN_NAME", "MAX_KEY_LENGTH", "SPAN_NAME", "OpenTelemetry", "from_environment"]

SPAN_NAME = "ratekeeper.decision"
"""The name of the span of each decision."""

CHARGE_SPAN_NAME = "ratekeeper.charge"
"""The name of the span of each charge without a check."""

MAX_KEY_LENGTH = 128
"""The most characters of a key a span records (``record_key=True``): keys come from clients."""

# The last store call of this thread or task, until a decision takes it: (duration in
# seconds, its end in time.time_ns(), the StoreError class name or None).
_LAST_CALL: ContextVar[tuple[float, int, str | None] | None] = ContextVar("ratekeeper_last_store_call", default=None)


def _api() -> tuple[Any, Any]:
    try:
        from opentelemetry import metrics, trace
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "ratekeeper's OpenTelemetry support needs opentelemetry-api: pip install 'ratekeeper[otel]'",
            name="opentelemetry",
        ) from exc
    return metrics, trace


class OpenTelemetry:
    """Records ratekeeper's reports through the OpenTelemetry API (see the module docstring).

    ``meter_provider`` and ``tracer_provider`` default to the global ones (those an SDK or
    ``opentelemetry-instrument`` set up). ``spans=False`` records the metrics only.
    ``record_key=True`` adds each decision's key, bounded, to its span (off by default:
    keys identify clients; see the module docstring).
    """

    def __init__(
        self,
        meter_provider: Any = None,
        tracer_provider: Any = None,
        *,
        spans: bool = True,
        namespace: str = "ratekeeper",
        record_key: bool = False,
    ) -> None:
        if type(record_key) is not bool:
            raise TypeError(f"record_key must be True or False, got {record_key!r}")
        metrics_api, trace_api = _api()
        meter = metrics_api.get_meter("ratekeeper", meter_provider=meter_provider)
        self.tracer: Any = trace_api.get_tracer("ratekeeper", tracer_provider=tracer_provider) if spans else None
        self.records_keys = record_key and spans
        """Whether spans carry the key (``Metrics`` then asks the limiter for keys)."""
        self._breaker = "closed"
        self._limits: dict[tuple[str, str], Limit] = {}
        self._lock = threading.Lock()

        def name(base: str) -> str:
            return f"{namespace}.{base}"

        def seconds(base: str, description: str) -> Any:
            # The Prometheus histograms' buckets, so both backends tell the same latencies apart.
            return meter.create_histogram(
                name(base), "s", description, explicit_bucket_boundaries_advisory=LATENCY_BUCKETS
            )

        self.decisions = meter.create_counter(
            name("decisions"), "{decision}", "Decisions that charged or refused, per rule and outcome"
        )
        self.charged_cost = meter.create_counter(
            name("charged_cost"), "{cost}", "Cost charged without a check (a cost known after the fact), per rule"
        )
        self.debt_charges = meter.create_counter(
            name("debt_charges"), "{charge}", "Charges without a check that left the key in debt, per rule"
        )
        self.refunded_cost = meter.create_counter(
            name("refunded_cost"), "{cost}", "Cost the store gave back (refunds, returned reservations), per rule"
        )
        self.settle_failures = meter.create_counter(
            name("settle_failures"), "{response}", "Responses whose real cost could not be settled (the store failed)"
        )
        self.store_latency = seconds("store_latency", "Duration of each store call")
        self.store_errors = meter.create_counter(
            name("store_errors"), "{call}", "Failed store calls, by the StoreError class raised"
        )
        self.reloads = meter.create_counter(name("config_reloads"), "{reload}", "Reloads of the rules, by result")
        self.requests = meter.create_counter(name("requests"), "{request}", "Requests received, by transport")
        self.decision_latency = seconds(
            "decision_latency", "Time one request's decision took, allowed and refused apart"
        )
        self.skips = meter.create_counter(
            name("skipped"), "{request}", "Requests a rule did not limit: their key could not be built"
        )
        observation = metrics_api.Observation
        meter.create_observable_gauge(
            name("breaker_state"),
            [lambda _options: [observation(int(s == self._breaker), {"state": s}) for s in BREAKER_STATES]],
            "1",
            "1 for the circuit breaker's current state, else 0",
        )
        meter.create_observable_gauge(
            name("rule_limit"),
            [self._observe_limits(observation, lambda limit: limit.count)],
            "{cost}",
            "The count of each limit of a configured rule",
        )
        meter.create_observable_gauge(
            name("rule_limit_period"),
            [self._observe_limits(observation, lambda limit: limit.period)],
            "s",
            "The period of each limit of a configured rule",
        )

    def _observe_limits(self, observation: Any, value: Callable[[Limit], float]) -> Callable[[Any], Iterator[Any]]:
        def observe(_options: Any) -> Iterator[Any]:
            for (rule, text), limit in list(self._limits.items()):
                yield observation(value(limit), {"rule": rule, "limit": text})

        return observe

    # -- what Metrics tells it ---------------------------------------------------------

    def decided(self, decision: Decision, rule: str, outcome: str, key: str | None = None) -> None:
        """Count one decision under its ``rule`` label and ``outcome``; trace it (with
        ``key`` when this object records keys)."""
        self.decisions.add(1, {"rule": rule, "outcome": outcome})
        if self.tracer is None:
            return
        attributes: dict[str, Any] = {
            "ratekeeper.rule": decision.rule,
            "ratekeeper.outcome": outcome,
            "ratekeeper.allowed": bool(decision.allowed),
            "ratekeeper.remaining": decision.remaining,
        }
        if decision.denied_by is not None:
            attributes["ratekeeper.denied_by"] = str(decision.denied_by)
        self._span(SPAN_NAME, decision, attributes, key)

    def charged(self, decision: Decision, rule: str, cost: int, in_debt: bool, key: str | None = None) -> None:
        """Count one charge without a check (its cost when it was applied; a debt); trace it."""
        labels = {"rule": rule}
        if decision.allowed:  # refused: the "deny" failure policy dropped it
            self.charged_cost.add(cost, labels)
            if in_debt:
                self.debt_charges.add(1, labels)
        if self.tracer is None:
            return
        attributes: dict[str, Any] = {
            "ratekeeper.rule": decision.rule,
            "ratekeeper.cost": cost,
            "ratekeeper.debt": in_debt,
            "ratekeeper.allowed": bool(decision.allowed),
            "ratekeeper.remaining": decision.remaining,
        }
        self._span(CHARGE_SPAN_NAME, decision, attributes, key)

    def refunded(self, rule: str, cost: int) -> None:
        """Count ``cost`` given back under the ``rule`` label."""
        self.refunded_cost.add(cost, {"rule": rule})

    def settle_failed(self, rule: str) -> None:
        """A response's real cost under the ``rule`` label could not be settled."""
        self.settle_failures.add(1, {"rule": rule})

    def _span(self, name: str, decision: Decision, attributes: dict[str, Any], key: str | None) -> None:
        """One finished span for ``decision``: from the start of the store call that answered
        it (when one did) to now."""
        end = time.time_ns()
        if decision.fallback is not None:
            attributes["ratekeeper.fallback"] = decision.fallback
        if key is not None and self.records_keys:
            if len(key) > MAX_KEY_LENGTH:
                attributes["ratekeeper.key"] = key[:MAX_KEY_LENGTH]
                attributes["ratekeeper.key_truncated"] = True
            else:
                attributes["ratekeeper.key"] = key
        start = end
        call = _LAST_CALL.get()
        if call is not None:
            _LAST_CALL.set(None)
            seconds, call_end, error = call
            attributes["ratekeeper.store.latency"] = seconds
            if error is not None:
                attributes["ratekeeper.store.error"] = error
            start = call_end - int(seconds * 1e9)
        span = self.tracer.start_span(name, attributes=attributes, start_time=start)
        span.end(end_time=end)

    def store_call(self, seconds: float, error: StoreError | None) -> None:
        """Observe one store call's duration; count its error by class name."""
        self.store_latency.record(seconds)
        cause = None if error is None else type(error).__name__
        if cause is not None:
            self.store_errors.add(1, {"cause": cause})
        if self.tracer is not None:
            _LAST_CALL.set((seconds, time.time_ns(), cause))

    def breaker_changed(self, old: str, new: str) -> None:
        """The breaker gauge reads ``new`` from now on."""
        self._breaker = new

    def skipped(self, rule: str) -> None:
        """A request the rule labelled ``rule`` did not limit."""
        self.skips.add(1, {"rule": rule})

    def reloaded(self, ok: bool) -> None:
        """A reload of the rules: accepted (``ok``) or refused."""
        self.reloads.add(1, {"result": "ok" if ok else "failed"})

    def decision_time(self, seconds: float, allowed: bool) -> None:
        """One request's decision took ``seconds``."""
        self.decision_latency.record(seconds, {"result": "allowed" if allowed else "refused"})

    def request(self, transport: str) -> None:
        """One request received over ``transport``."""
        self.requests.add(1, {"transport": transport})

    def rule_limits(self, limits: Mapping[str, Iterable[Limit]]) -> None:
        """The limits of every configured rule from now on (the ``rule_limit`` gauges)."""
        self._limits = {(rule, str(limit)): limit for rule, ls in limits.items() for limit in ls}


def from_environment(*, record_key: bool = False) -> tuple[OpenTelemetry, Callable[[], None]]:
    """An ``OpenTelemetry`` on SDK providers configured by the standard ``OTEL_*``
    variables, and the function that flushes and shuts them down.

    ``OTEL_TRACES_EXPORTER`` and ``OTEL_METRICS_EXPORTER`` name the exporters (``otlp`` by
    default, ``console``, ``none``; several separated by commas), found by the entry points
    the exporter packages declare, as ``opentelemetry-instrument`` finds them; each
    exporter reads its own variables (``OTEL_EXPORTER_OTLP_ENDPOINT``, ...), the resource
    reads ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``, the metric reader
    ``OTEL_METRIC_EXPORT_INTERVAL``. ``ConfigurationError`` when ``opentelemetry-sdk`` or
    an exporter named is not installed. ``record_key``: each span carries the key
    (``OpenTelemetry(record_key=True)``).
    """
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            "--otel needs the OpenTelemetry SDK and an exporter: pip install opentelemetry-sdk "
            "opentelemetry-exporter-otlp (or set OTEL_TRACES_EXPORTER and OTEL_METRICS_EXPORTER to console)"
        ) from exc

    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    resource = Resource.create({} if named else {"service.name": "ratekeeper"})
    tracer_provider = TracerProvider(resource=resource)
    for exporter in _exporters("opentelemetry_traces_exporter", "OTEL_TRACES_EXPORTER"):
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    readers = [
        PeriodicExportingMetricReader(exporter)
        for exporter in _exporters("opentelemetry_metrics_exporter", "OTEL_METRICS_EXPORTER")
    ]
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)

    def shutdown() -> None:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return OpenTelemetry(meter_provider, tracer_provider, record_key=record_key), shutdown


def _exporters(group: str, variable: str) -> list[Any]:
    """The exporters that ``variable`` names, each built with no arguments."""
    from importlib.metadata import entry_points

    names = [n.strip() for n in os.environ.get(variable, "otlp").split(",") if n.strip() and n.strip() != "none"]
    exporters = []
    for exporter_name in names:
        found = entry_points(group=group, name=exporter_name)
        if not found:
            raise ConfigurationError(
                f"{variable}={exporter_name}: no OpenTelemetry exporter of that name is installed "
                f"(otlp: pip install opentelemetry-exporter-otlp)"
            )
        exporters.append(next(iter(found)).load()())
    return exporters
