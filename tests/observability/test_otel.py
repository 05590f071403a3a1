"""ratekeeper.otel through the SDK's in-memory reader and exporter: the same counts as the
Prometheus metrics, a span per decision with its rule, outcome and store latency and never
its key, the limit gauges, and a failing store's fallback; then a real app with the
middleware under uvicorn."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ratekeeper import Limiter, Rule
from ratekeeper.metrics import Metrics
from ratekeeper.otel import SPAN_NAME, OpenTelemetry
from servers import free_port

SECRET = "user-4f1c9-secret"
"""A key that must reach no span."""


@dataclass
class Exported:
    metrics: Metrics
    reader: InMemoryMetricReader
    spans: InMemorySpanExporter

    def points(self, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
        """The data points of instrument ``name`` by their sorted attributes."""
        data = self.reader.get_metrics_data()
        found: dict[tuple[tuple[str, Any], ...], Any] = {}
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            found[tuple(sorted(point.attributes.items()))] = point
        return found

    def decision_spans(self) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == SPAN_NAME]


@pytest.fixture
def exported() -> Iterator[Exported]:
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    yield Exported(Metrics(otel=OpenTelemetry(meter_provider, tracer_provider)), reader, spans)
    meter_provider.shutdown()
    tracer_provider.shutdown()


def test_the_instruments_count_what_the_prometheus_metrics_count(exported: Exported) -> None:
    metrics = exported.metrics
    rule = Rule("otel.api", "2/minute")
    metrics.configured_rules([rule])
    limiter = Limiter("memory://", observer=metrics)
    outcomes = [limiter.try_acquire(rule, SECRET).allowed for _ in range(3)]
    assert [True, True, False] == outcomes
    decisions = exported.points("ratekeeper.decisions")
    for outcome in ("within", "near", "over"):
        prometheus = metrics.value("ratekeeper_decisions_total", rule="otel.api", outcome=outcome)
        assert 1 == prometheus == decisions[(("outcome", outcome), ("rule", "otel.api"))].value
    store_calls = exported.points("ratekeeper.store_latency")[()]
    assert 3 == store_calls.count == metrics.value("ratekeeper_store_latency_seconds_count")
    assert list(store_calls.explicit_bounds)[:3] == [0.0001, 0.00025, 0.0005]
    breaker = {dict(k)["state"]: p.value for k, p in exported.points("ratekeeper.breaker_state").items()}
    assert {"closed": 1, "open": 0, "half_open": 0} == breaker


def test_each_decision_is_a_span_with_its_rule_outcome_and_store_latency_and_no_key(exported: Exported) -> None:
    rule = Rule("otel.login", "1/minute")
    limiter = Limiter("memory://", observer=exported.metrics)
    limiter.try_acquire(rule, SECRET)
    limiter.try_acquire(rule, SECRET)
    spans = exported.decision_spans()
    assert [("near", True), ("over", False)] == [
        (s.attributes["ratekeeper.outcome"], s.attributes["ratekeeper.allowed"]) for s in spans
    ]
    for span in spans:
        attributes = dict(span.attributes or {})
        assert "otel.login" == attributes["ratekeeper.rule"]
        latency = attributes["ratekeeper.store.latency"]
        assert 0 < latency < 5
        assert span.start_time is not None and span.end_time is not None
        assert span.end_time - span.start_time >= int(latency * 1e9) - 1  # the span covers the store call
        assert SECRET not in span.to_json()
    assert "1/minute" == spans[1].attributes["ratekeeper.denied_by"]
    assert "ratekeeper.denied_by" not in spans[0].attributes


def test_the_limit_gauges_follow_the_configured_rules(exported: Exported) -> None:
    metrics = exported.metrics
    metrics.configured_rules([Rule("otel.a", ["5/3s", "20/minute"]), "otel.named-only"])

    def limits() -> dict[tuple[str, str], tuple[Any, Any]]:
        counts = exported.points("ratekeeper.rule_limit")
        periods = exported.points("ratekeeper.rule_limit_period")
        return {(dict(k)["rule"], dict(k)["limit"]): (p.value, periods[k].value) for k, p in counts.items()}

    assert {("otel.a", "5/3s"): (5, 3.0), ("otel.a", "20/minute"): (20, 60.0)} == limits()
    assert 5 == metrics.value("ratekeeper_rule_limit", rule="otel.a", limit="5/3s")
    assert 60 == metrics.value("ratekeeper_rule_limit_period_seconds", rule="otel.a", limit="20/minute")
    # Another source's rules join; a changed rule replaces its series.
    metrics.configured_rules([Rule("otel.b", "1/second")], source="other")
    metrics.configured_rules([Rule("otel.a", "7/second")])
    assert {("otel.a", "7/second"): (7, 1.0), ("otel.b", "1/second"): (1, 1.0)} == limits()
    assert metrics.value("ratekeeper_rule_limit", rule="otel.a", limit="5/3s") is None
    assert 7 == metrics.value("ratekeeper_rule_limit", rule="otel.a", limit="7/second")
    assert 1 == metrics.value("ratekeeper_rule_limit", rule="otel.b", limit="1/second")


def test_a_failing_store_reports_its_error_and_the_policys_decision(exported: Exported) -> None:
    limiter = Limiter(f"redis://127.0.0.1:{free_port()}/0", on_error="allow", timeout=1.0, observer=exported.metrics)
    try:
        assert limiter.try_acquire(Rule("otel.down", "1/minute"), SECRET).allowed
    finally:
        limiter.close()
    (span,) = exported.decision_spans()
    assert "allow" == span.attributes["ratekeeper.fallback"]
    assert "fallback" == span.attributes["ratekeeper.outcome"]
    error = span.attributes["ratekeeper.store.error"]
    assert error.endswith("Error") or error == "StoreTimeout"
    assert {(("cause", error),)} == set(exported.points("ratekeeper.store_errors"))


def test_a_real_app_with_the_middleware_exports_its_decisions_and_requests(exported: Exported) -> None:
    """Starlette under uvicorn, the middleware given the one ``Metrics``: per request, the
    transport, the decision time and a span; the rule's limit as a gauge."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from ratekeeper.web import RateLimitMiddleware
    from web.conftest import http_rule
    from web.uvicorn_server import serve

    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/items/{user}", hello), Route("/free", hello)])
    rule = http_rule("otel.items", "1/minute", path="/items/{user}", key="{path.user}")
    app.add_middleware(RateLimitMiddleware, rules=[rule], metrics=exported.metrics)
    with serve(app) as base, httpx.Client(base_url=base, timeout=5) as client:
        codes = [client.get(path).status_code for path in (f"/items/{SECRET}",) * 3 + ("/free",)]
    assert [200, 429, 429, 200] == codes
    latency = {dict(k)["result"]: p.count for k, p in exported.points("ratekeeper.decision_latency").items()}
    assert {"allowed": 1, "refused": 2} == latency
    assert 4 == exported.points("ratekeeper.requests")[(("transport", "asgi"),)].value
    limit = exported.points("ratekeeper.rule_limit")[(("limit", "1/minute"), ("rule", "otel.items"))]
    assert 1 == limit.value
    spans = exported.decision_spans()
    assert ["near", "over", "over"] == [s.attributes["ratekeeper.outcome"] for s in spans]
    assert all(SECRET not in s.to_json() for s in spans)


def test_a_servers_request_counter_counts_in_both(exported: Exported) -> None:
    count = exported.metrics.request_counter("http")
    count()
    count()
    assert 2 == exported.metrics.value("ratekeeper_requests_total", transport="http")
    assert 2 == exported.points("ratekeeper.requests")[(("transport", "http"),)].value


def test_a_decision_span_is_a_child_of_the_span_current_where_it_was_decided() -> None:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    metrics = Metrics(otel=OpenTelemetry(MeterProvider(), tracer_provider))
    limiter = Limiter("memory://", observer=metrics)
    with tracer_provider.get_tracer("app").start_as_current_span("GET /items") as request:
        limiter.try_acquire(Rule("otel.nested", "5/minute"), SECRET)
    (decision,) = [s for s in spans.get_finished_spans() if s.name == SPAN_NAME]
    assert decision.parent is not None
    assert request.get_span_context().span_id == decision.parent.span_id
    assert request.get_span_context().trace_id == decision.context.trace_id
