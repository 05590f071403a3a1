"""Prometheus metrics (ratekeeper.metrics): per rule and outcome, never per key, read back
from a real CollectorRegistry, its text exposition and, when installed, a real Prometheus."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from ratekeeper import Limiter, Rule
from ratekeeper.limiter.breaker import CircuitBreaker
from ratekeeper.metrics import Metrics, outcome_of
from ratekeeper.testing import FakeClock
from servers import free_port, wait_until

DECISIONS = "ratekeeper_decisions_total"


def samples(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the text exposition, parsed by prometheus_client's own parser."""
    body, content_type = metrics.exposition()
    assert content_type.startswith("text/plain; version=0.0.4")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def count(metrics: Metrics, rule: str, outcome: str) -> float:
    return metrics.value(DECISIONS, rule=rule, outcome=outcome) or 0.0


def test_decisions_are_counted_by_rule_and_outcome_within_near_over() -> None:
    metrics = Metrics()
    rule = Rule("m.items", ["10/minute"], algorithm="fixed_window")
    limiter = Limiter("memory://", clock=FakeClock(), observer=metrics)
    for _ in range(12):
        limiter.try_acquire(rule, "alice")
    # remaining after each admission: 9..0; used share >= 80 % from the 8th admission on
    assert 7 == count(metrics, "m.items", "within")
    assert 3 == count(metrics, "m.items", "near")
    assert 2 == count(metrics, "m.items", "over")
    assert 0 == count(metrics, "m.items", "shadow_over")


def test_the_most_used_limit_of_a_rule_makes_it_near() -> None:
    metrics = Metrics()
    rule = Rule("m.two", ["5/3s", "100/minute"], algorithm="sliding_window_log")
    limiter = Limiter("memory://", clock=FakeClock(), observer=metrics)
    decisions = [limiter.try_acquire(rule, "k") for _ in range(4)]
    assert ["within", "within", "within", "near"] == [outcome_of(d) for d in decisions]
    assert 1 == count(metrics, "m.two", "near")


def test_refusals_of_shadow_rules_count_as_shadow_over() -> None:
    metrics = Metrics()
    metrics.shadow_rules(["m.shadow"])
    shadow = Rule("m.shadow", ["1/minute"])
    plain = Rule("m.plain", ["1/minute"])
    limiter = Limiter("memory://", clock=FakeClock(), observer=metrics)
    for rule in (shadow, shadow, plain, plain):
        limiter.try_acquire(rule, "k")
    assert 1 == count(metrics, "m.shadow", "shadow_over")
    assert 0 == count(metrics, "m.shadow", "over")
    assert 1 == count(metrics, "m.plain", "over")
    metrics.shadow_rules([])  # the set is replaced, not extended
    limiter.try_acquire(shadow, "k")
    assert 1 == count(metrics, "m.shadow", "over")


def test_batches_count_each_item() -> None:
    metrics = Metrics()
    a, b = Rule("m.a", ["1/minute"]), Rule("m.b", ["5/minute"])
    limiter = Limiter("memory://", clock=FakeClock(), observer=metrics)
    limiter.try_acquire_many([(a, "k"), (b, "k")])
    limiter.try_acquire_many([(a, "k"), (b, "k")])
    assert 1 == count(metrics, "m.a", "near")  # 1/minute used up: 100 %
    assert 1 == count(metrics, "m.a", "over")
    assert 2 == count(metrics, "m.b", "within")


def test_a_dead_store_counts_fallbacks_errors_by_cause_and_the_breaker_state() -> None:
    metrics = Metrics()
    rule = Rule("m.fallback", ["5/minute"], on_error="allow")
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there: connection refused
    breaker = CircuitBreaker(failures=2, cool_down=60)
    with Limiter(dead, observer=metrics, breaker=breaker, timeout=2.0) as limiter:
        for _ in range(4):
            assert limiter.try_acquire(rule, "k").fallback == "allow"
    assert 4 == count(metrics, "m.fallback", "fallback")
    errors = {labels: v for (name, labels), v in samples(metrics).items() if name == "ratekeeper_store_errors_total"}
    assert 2 == sum(errors.values())  # two calls reached the store; then the breaker opened
    assert all(dict(labels)["cause"].startswith("Store") for labels in errors)
    assert 2 == metrics.value("ratekeeper_store_latency_seconds_count")
    assert 1 == metrics.value("ratekeeper_breaker_state", state="open")
    assert 0 == metrics.value("ratekeeper_breaker_state", state="closed")


def test_a_healthy_store_reports_latency_and_a_closed_breaker() -> None:
    metrics = Metrics()
    limiter = Limiter("memory://", clock=FakeClock(), observer=metrics)
    limiter.try_acquire(Rule("m.lat", ["5/minute"]), "k")
    assert 1 == metrics.value("ratekeeper_store_latency_seconds_count")
    assert 1 == metrics.value("ratekeeper_breaker_state", state="closed")
    assert 0 == metrics.value("ratekeeper_breaker_state", state="half_open")
    assert metrics.value("ratekeeper_store_errors_total", cause="StoreError") is None


def test_reloads_requests_and_skips_are_counted() -> None:
    metrics = Metrics()
    assert 0 == metrics.value("ratekeeper_config_reloads_total", result="failed")  # exists before any failure
    metrics.reloaded(True)
    metrics.reloaded(False)
    metrics.reloaded(False)
    for transport in ("http", "http", "grpc"):
        metrics.request(transport)
    metrics.skipped("m.skip")
    assert 1 == metrics.value("ratekeeper_config_reloads_total", result="ok")
    assert 2 == metrics.value("ratekeeper_config_reloads_total", result="failed")
    assert 2 == metrics.value("ratekeeper_requests_total", transport="http")
    assert 1 == metrics.value("ratekeeper_requests_total", transport="grpc")
    assert 1 == metrics.value("ratekeeper_skipped_total", rule="m.skip")


def test_no_series_is_labelled_with_a_key() -> None:
    metrics = Metrics()
    rule = Rule("m.keys", ["2/minute"])
    limiter = Limiter("memory://", clock=FakeClock(), observer=metrics)
    for i in range(50):
        limiter.try_acquire(rule, f"secret-key-{i}")
    body, _ = metrics.exposition()
    assert b"secret-key" not in body
    series = [labels for (name, labels) in samples(metrics) if name == DECISIONS]
    assert {frozenset({("rule", "m.keys"), ("outcome", "within")})} == set(series)
    assert 50 == count(metrics, "m.keys", "within")


def test_the_exposition_parses_and_answers_openmetrics_when_asked() -> None:
    metrics = Metrics(namespace="svc")
    metrics.request("http")
    parsed = samples(metrics)
    assert 1 == parsed[("svc_requests_total", frozenset({("transport", "http")}))]
    body, content_type = metrics.exposition("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


def test_two_metrics_never_collide_and_a_given_registry_is_used() -> None:
    Metrics()
    Metrics()  # each has its own registry by default
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.request("grpc")
    assert 1 == registry.get_sample_value("ratekeeper_requests_total", {"transport": "grpc"})
    assert metrics.registry is not REGISTRY


def test_near_must_be_a_share() -> None:
    with pytest.raises(ValueError, match="near must be a share"):
        Metrics(near=1.5)


def test_without_prometheus_client_the_error_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from ratekeeper.metrics import Metrics\n"  # importing the module needs nothing
        "try:\n    Metrics()\nexcept ModuleNotFoundError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "pip install 'ratekeeper[metrics]'" in out.stdout


# --- a real Prometheus server scrapes the exposition -----------------------------------


class _Exporter:
    """Serves ``metrics.exposition()`` at /metrics on a free port, in a thread."""

    def __init__(self, metrics: Metrics) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body, content_type = metrics.exposition(self.headers.get("Accept"))
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Exporter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (apt-get install -y prometheus)")
    yield Path(binary), free_port()


def _query(port: int, expr: str) -> list[dict[str, object]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.request.quote(expr)}"
    with urllib.request.urlopen(url, timeout=5) as reply:
        data = json.load(reply)
    assert "success" == data["status"]
    result: list[dict[str, object]] = data["data"]["result"]
    return result


def test_a_real_prometheus_scrapes_the_metrics(prometheus: tuple[Path, int], tmp_path: Path) -> None:
    binary, port = prometheus
    metrics = Metrics()
    rule = Rule("m.scraped", ["3/minute"])
    limiter = Limiter("memory://", clock=FakeClock(), observer=metrics)
    for _ in range(5):
        limiter.try_acquire(rule, "k")
    with _Exporter(metrics) as exporter:
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: rk\n    static_configs: [{{targets: ['127.0.0.1:{exporter.port}']}}]\n"
        )
        log = (tmp_path / "prometheus.log").open("w")
        proc = subprocess.Popen(
            [
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(lambda: bool(_query(port, f'{DECISIONS}{{rule="m.scraped"}}')), timeout=30, what="a scrape")
            found = {
                r["metric"]["outcome"]: r["value"][1]  # type: ignore[index]
                for r in _query(port, f'{DECISIONS}{{rule="m.scraped"}}')
            }
            assert {"within": "2", "near": "1", "over": "2"} == found
            up = _query(port, 'up{job="rk"}')
            assert "1" == up[0]["value"][1]  # type: ignore[index]
        finally:
            proc.terminate()
            proc.wait(timeout=20)
            log.close()
