"""ratekeeper.otel and charges without a check, and the opt-in key: the charge counters equal
the Prometheus ones, a charge is a span of its own, and ``ratekeeper.key`` is on a span only
with ``record_key=True``, cut to ``MAX_KEY_LENGTH``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from observability.test_otel import SECRET, Exported
from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.decision import Decision
from ratekeeper.errors import StoreError
from ratekeeper.metrics import OTHER_RULE, Metrics
from ratekeeper.otel import CHARGE_SPAN_NAME, MAX_KEY_LENGTH, SPAN_NAME, OpenTelemetry
from ratekeeper.rule import MAX_KEY_LENGTH as MAX_KEY
from ratekeeper.testing import FakeClock
from servers import free_port

TOKENS = Rule("otel.tokens", "100/min", algorithm="token_bucket")


@pytest.fixture
def export() -> Iterator[Callable[..., Exported]]:
    """Builds an ``Exported`` whose ``OpenTelemetry`` takes the options given."""
    providers: list[MeterProvider | TracerProvider] = []

    def build(**options: bool) -> Exported:
        reader = InMemoryMetricReader()
        meter_provider = MeterProvider(metric_readers=[reader])
        spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
        providers.extend((meter_provider, tracer_provider))
        otel = OpenTelemetry(meter_provider, tracer_provider, **options)
        return Exported(Metrics(otel=otel), reader, spans)

    yield build
    for provider in providers:
        provider.shutdown()


def test_the_charge_instruments_count_what_the_prometheus_metrics_count(export: Callable[..., Exported]) -> None:
    exported = export()
    metrics = exported.metrics
    metrics.configured_rules([TOKENS])
    with Limiter("memory://", clock=FakeClock(), observer=metrics) as limiter:
        limiter.charge(TOKENS, SECRET, 30)
        limiter.charge(TOKENS, SECRET, 130)  # in debt
        limiter.refund(TOKENS, SECRET, 12)
        limiter.charge(Rule("made.up", "5/min", algorithm="token_bucket"), SECRET, 9)  # in debt, under _other
    for instrument, prometheus, rule, value in [
        ("ratekeeper.charged_cost", "ratekeeper_charged_cost_total", "otel.tokens", 160),
        ("ratekeeper.debt_charges", "ratekeeper_debt_charges_total", "otel.tokens", 1),
        ("ratekeeper.refunded_cost", "ratekeeper_refunded_cost_total", "otel.tokens", 12),
        ("ratekeeper.charged_cost", "ratekeeper_charged_cost_total", OTHER_RULE, 9),
        ("ratekeeper.debt_charges", "ratekeeper_debt_charges_total", OTHER_RULE, 1),
    ]:
        point = exported.points(instrument)[(("rule", rule),)]
        assert value == point.value == metrics.value(prometheus, rule=rule), instrument
    assert {(("rule", "otel.tokens"),), (("rule", OTHER_RULE),)} == set(exported.points("ratekeeper.charged_cost"))


def test_every_prometheus_metric_of_a_charge_has_its_instrument(export: Callable[..., Exported]) -> None:
    """The instruments stay the Prometheus metrics: a name added to one backend only fails here."""
    exported = export()
    with Limiter("memory://", clock=FakeClock(), observer=exported.metrics) as limiter:
        limiter.charge(TOKENS, "k", 150)
        limiter.refund(TOKENS, "k", 1)
    body, _ = exported.metrics.exposition()
    prometheus = {line.split("{")[0] for line in body.decode().splitlines() if line.startswith("ratekeeper_")}
    for name in ("charged_cost", "debt_charges", "refunded_cost"):
        assert f"ratekeeper_{name}_total" in prometheus
        assert exported.points(f"ratekeeper.{name}"), name


def test_a_charge_is_a_span_with_its_cost_debt_and_store_latency_and_no_key(export: Callable[..., Exported]) -> None:
    exported = export()
    with Limiter("memory://", clock=FakeClock(), observer=exported.metrics) as limiter:
        limiter.try_acquire(TOKENS, SECRET, 10)
        limiter.charge(TOKENS, SECRET, 30)
        limiter.charge(TOKENS, SECRET, 130)
    finished = exported.spans.get_finished_spans()
    assert [SPAN_NAME, CHARGE_SPAN_NAME, CHARGE_SPAN_NAME] == [s.name for s in finished]
    charges = [dict(s.attributes or {}) for s in finished[1:]]
    assert [(30, False, 60), (130, True, -70)] == [
        (a["ratekeeper.cost"], a["ratekeeper.debt"], a["ratekeeper.remaining"]) for a in charges
    ]
    for attributes in charges:
        assert "otel.tokens" == attributes["ratekeeper.rule"]
        assert 0 < attributes["ratekeeper.store.latency"] < 5  # each took its own store call's
    assert all(SECRET not in s.to_json() and "ratekeeper.key" not in (s.attributes or {}) for s in finished)


def test_a_charge_answered_by_the_failure_policy_is_a_span_with_the_fallback(export: Callable[..., Exported]) -> None:
    exported = export()
    down = Limiter(f"redis://127.0.0.1:{free_port()}/0", on_error="allow", timeout=0.5, observer=exported.metrics)
    try:
        down.charge(TOKENS, SECRET, 130)
    finally:
        down.close()
    (span,) = exported.spans.get_finished_spans()
    assert CHARGE_SPAN_NAME == span.name
    assert "allow" == span.attributes["ratekeeper.fallback"]
    assert span.attributes["ratekeeper.debt"] is True
    assert "ratekeeper.store.error" in span.attributes


def test_record_key_puts_the_key_on_decision_and_charge_spans(export: Callable[..., Exported]) -> None:
    exported = export(record_key=True)
    assert exported.metrics.wants_keys is True
    with Limiter("memory://", clock=FakeClock(), observer=exported.metrics) as limiter:
        limiter.try_acquire(TOKENS, SECRET)
        limiter.try_acquire_many([(TOKENS, "batch-1"), (TOKENS, "batch-2")])
        limiter.charge(TOKENS, SECRET, 5)
    keys = [(s.name, (s.attributes or {}).get("ratekeeper.key")) for s in exported.spans.get_finished_spans()]
    assert [
        (SPAN_NAME, SECRET),
        (SPAN_NAME, "batch-1"),
        (SPAN_NAME, "batch-2"),
        (CHARGE_SPAN_NAME, SECRET),
    ] == keys
    assert not any("ratekeeper.key_truncated" in (s.attributes or {}) for s in exported.spans.get_finished_spans())
    # Keys are for spans only: no metric series carries one.
    body, _ = exported.metrics.exposition()
    assert SECRET not in body.decode()
    data = exported.reader.get_metrics_data()
    assert data is not None and SECRET not in data.to_json()


def test_a_long_key_is_cut_to_max_key_length(export: Callable[..., Exported]) -> None:
    exported = export(record_key=True)
    hostile = "k" * (MAX_KEY - 1) + "!"  # the longest key a limiter accepts
    exact = "e" * MAX_KEY_LENGTH

    async def run() -> None:
        async with AsyncLimiter("memory://", clock=FakeClock(), observer=exported.metrics) as limiter:
            await limiter.try_acquire(TOKENS, hostile)
            await limiter.charge(TOKENS, hostile, 1)
            await limiter.try_acquire(TOKENS, exact)

    asyncio.run(run())
    cut, charge, whole = [dict(s.attributes or {}) for s in exported.spans.get_finished_spans()]
    for attributes in (cut, charge):
        assert "k" * MAX_KEY_LENGTH == attributes["ratekeeper.key"]
        assert attributes["ratekeeper.key_truncated"] is True
    assert exact == whole["ratekeeper.key"] and "ratekeeper.key_truncated" not in whole


def test_without_spans_no_key_is_asked_for(export: Callable[..., Exported]) -> None:
    exported = export(record_key=True, spans=False)
    assert exported.metrics.wants_keys is False
    with Limiter("memory://", clock=FakeClock(), observer=exported.metrics) as limiter:
        limiter.charge(TOKENS, SECRET, 5)
    assert 5 == exported.points("ratekeeper.charged_cost")[(("rule", "otel.tokens"),)].value


def test_record_key_takes_a_bool_only() -> None:
    with pytest.raises(TypeError, match="record_key must be True or False"):
        OpenTelemetry(MeterProvider(), TracerProvider(), record_key="yes")  # type: ignore[arg-type]


class Settling(Metrics):
    """``Metrics`` that tells the test thread each charge and refund it was told (the
    middleware settles a response after sending it, on the server's thread)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.settled = threading.Semaphore(0)

    def charged(self, decision: Decision, cost: int, key: str | None = None) -> None:
        super().charged(decision, cost, key)
        self.settled.release()

    def refunded(self, rule: str, cost: int) -> None:
        super().refunded(rule, cost)
        self.settled.release()

    def settle_failed(self, rule: str) -> None:
        super().settle_failed(rule)
        self.settled.release()

    def wait(self) -> None:
        assert self.settled.acquire(timeout=10), "the response was not settled"


def test_a_real_app_settling_response_costs_reports_charges_debts_and_refunds(
    export: Callable[..., Exported],
) -> None:
    """Starlette under uvicorn, ``response_cost`` from a header: the estimate (1) is
    settled by a charge past what is left (debt), then a refund; each key on its span."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from ratekeeper.web import RateLimitMiddleware
    from web.conftest import http_rule
    from web.uvicorn_server import serve

    built = export(record_key=True)
    assert built.metrics.otel is not None
    metrics = Settling(otel=built.metrics.otel)
    exported = Exported(metrics, built.reader, built.spans)

    async def chat(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok", headers={"x-tokens-used": request.query_params["used"]})

    app = Starlette(routes=[Route("/chat/{user}", chat)])
    rule = http_rule("otel.chat", "100/minute", path="/chat/{user}", key="{path.user}", algorithm="token_bucket")
    limiter = AsyncLimiter("memory://", clock=FakeClock(), observer=metrics)
    options = {"rules": [rule], "limiter": limiter, "metrics": metrics, "response_cost": "x-tokens-used"}
    app.add_middleware(RateLimitMiddleware, **options)
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        assert 200 == client.get(f"/chat/{SECRET}", params={"used": "131"}).status_code
        metrics.wait()  # 130 more than the estimate charged: 131 of 100, 31 in debt
        assert 429 == client.get(f"/chat/{SECRET}", params={"used": "1"}).status_code
        assert 200 == client.get("/chat/light", params={"used": "0"}).status_code
        metrics.wait()  # cost nothing: the estimate given back
    for instrument, prometheus, value in [
        ("ratekeeper.charged_cost", "ratekeeper_charged_cost_total", 130),
        ("ratekeeper.debt_charges", "ratekeeper_debt_charges_total", 1),
        ("ratekeeper.refunded_cost", "ratekeeper_refunded_cost_total", 1),
    ]:
        point = exported.points(instrument)[(("rule", "otel.chat"),)]
        assert value == point.value == metrics.value(prometheus, rule="otel.chat"), instrument
    spans = [(s.name, dict(s.attributes or {})) for s in exported.spans.get_finished_spans()]
    assert [
        (SPAN_NAME, SECRET, "within"),
        (CHARGE_SPAN_NAME, SECRET, None),
        (SPAN_NAME, SECRET, "over"),
        (SPAN_NAME, "light", "within"),
    ] == [(name, a.get("ratekeeper.key"), a.get("ratekeeper.outcome")) for name, a in spans]
    assert -31 == spans[1][1]["ratekeeper.remaining"] and spans[1][1]["ratekeeper.debt"] is True


class StoreGoneAfterAdmission(AsyncLimiter):
    """Admits as the memory store does, then fails every settlement as a store that went away."""

    async def charge(self, rule: Rule, key: str, cost: int, *, now: int | None = None) -> Decision:
        raise StoreError("the store went away")

    async def refund(self, rule: Rule, key: str, cost: int = 1, *, lease_id: str | None = None) -> bool:
        raise StoreError("the store went away")


def test_a_settlement_the_store_failed_is_counted_in_both(export: Callable[..., Exported]) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from ratekeeper.web import RateLimitMiddleware
    from web.conftest import http_rule
    from web.uvicorn_server import serve

    built = export()
    assert built.metrics.otel is not None
    metrics = Settling(otel=built.metrics.otel)

    async def chat(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok", headers={"x-tokens-used": request.query_params["used"]})

    app = Starlette(routes=[Route("/chat", chat)])
    rule = http_rule("otel.settle", "100/minute", path="/chat", algorithm="token_bucket")
    limiter = StoreGoneAfterAdmission("memory://", clock=FakeClock(), observer=metrics)
    options = {"rules": [rule], "limiter": limiter, "metrics": metrics, "response_cost": "x-tokens-used"}
    app.add_middleware(RateLimitMiddleware, **options)
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        assert 200 == client.get("/chat", params={"used": "50"}).status_code  # a charge that fails
        metrics.wait()
        assert 200 == client.get("/chat", params={"used": "0"}).status_code  # a refund that fails
        metrics.wait()
    exported = Exported(metrics, built.reader, built.spans)
    assert 2 == metrics.value("ratekeeper_settle_failures_total", rule="otel.settle")
    assert 2 == exported.points("ratekeeper.settle_failures")[(("rule", "otel.settle"),)].value
    assert metrics.value("ratekeeper_charged_cost_total", rule="otel.settle") is None  # nothing was charged
