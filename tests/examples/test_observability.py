"""examples/observability: the alert rules pass promtool's checks and unit tests, and a real
Prometheus scraping two real ``ratekeeper serve`` (one healthy under allowed and refused
load, one whose store is down) answers every dashboard panel's query with data and
evaluates every alert expression."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from server.clients import OK, OVER_LIMIT, descriptor, envoy_request, should_rate_limit
from server.conftest import Served, start_server
from servers import free_port, wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "observability"

# What Grafana puts in place of its macros; the scrape interval is 1 s, so 30 s holds
# plenty of samples for rate().
MACROS = {"$__rate_interval": "30s", "$__range": "5m"}

RULES = """
rules:
  - name: obs.partner
    limits: ["5/minute"]
  - name: obs.login
    limits: ["20/minute", "5/3s"]
  - name: obs.shadow
    limits: ["1/minute"]
    shadow: true
"""

ENVOY = """
domain: obs_envoy
descriptors:
  - key: partner
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


def _promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool is not installed (apt-get install -y prometheus)")
    return binary


def _panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL with the Grafana macros replaced) of every dashboard target."""
    dashboard = json.loads((EXAMPLES / "dashboard.json").read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for macro, value in MACROS.items():
                expr = expr.replace(macro, value)
            out.append((panel["title"], expr))
    return out


def _alert_exprs() -> dict[str, str]:
    groups = yaml.safe_load((EXAMPLES / "alerts.yml").read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def test_promtool_checks_the_rules_and_the_config_and_runs_the_alert_unit_tests() -> None:
    promtool = _promtool()
    checks = (
        ["check", "rules", "alerts.yml"],
        ["check", "config", "prometheus.yml"],
        ["test", "rules", "alerts_test.yml"],
    )
    for args in checks:
        run = subprocess.run([promtool, *args], check=False, cwd=EXAMPLES, capture_output=True, text=True, timeout=60)
        assert 0 == run.returncode, f"promtool {' '.join(args)}:\n{run.stdout}{run.stderr}"
    # Every alert has a unit test (a new rule without one fails here).
    tested = set()
    for case in yaml.safe_load((EXAMPLES / "alerts_test.yml").read_text())["tests"]:
        tested |= {t["alertname"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert set(_alert_exprs()) == tested


def test_the_dashboard_has_the_partner_teams_panels() -> None:
    titles = {title for title, _ in _panel_queries()}
    for wanted in (
        "Limiter latency: max",
        "Limiter latency: mean",
        "Limiter latency: p99",
        "Admitted per rule",
        "Refused per rule",
        "Refused share per rule",
        "Fallback decisions",
        "Store errors",
        "Breaker state",
        "Reloads",
        "Requests per transport",
    ):
        assert wanted in titles
    latency = [expr for title, expr in _panel_queries() if title.startswith("Limiter latency")]
    assert all("by (result" in expr for expr in latency), "allowed and refused apart"


def test_the_middleware_times_its_decisions_allowed_and_refused_apart() -> None:
    """An app with the middleware (real uvicorn) reports the decision latency the dashboard
    draws: one admitted request, two refused, and none for a path no rule limits."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from ratekeeper.metrics import Metrics
    from ratekeeper.web import RateLimitMiddleware
    from web.conftest import http_rule
    from web.uvicorn_server import serve

    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    metrics = Metrics()
    app = Starlette(routes=[Route("/items/{user}", hello), Route("/free", hello)])
    rule = http_rule("obs.items", "1/minute", path="/items/{user}", key="{path.user}")
    app.add_middleware(RateLimitMiddleware, rules=[rule], metrics=metrics)
    with serve(app) as base, httpx.Client(base_url=base, timeout=5) as client:
        codes = [client.get(path).status_code for path in ("/items/a", "/items/a", "/items/a", "/free")]
    assert [200, 429, 429, 200] == codes
    count = "ratekeeper_decision_latency_seconds_count"
    assert 1 == metrics.value(count, result="allowed")
    assert 2 == metrics.value(count, result="refused")
    assert 0 < (metrics.value("ratekeeper_decision_latency_seconds_sum", result="allowed") or 0) < 5


def test_the_service_times_its_grpc_decisions(tmp_path: Path) -> None:
    """gRPC ShouldRateLimit reports the decision latency as /v1/check does: on a rule of
    1/minute, one allowed and two refused, read back from the admin surface's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    served = start_server(tmp_path, rules=[ENVOY])
    try:
        codes = [
            should_rate_limit(
                served.grpc_target, envoy_request("obs_envoy", [descriptor(("partner", "p"))])
            ).overall_code
            for _ in range(3)
        ]
        assert [OK, OVER_LIMIT, OVER_LIMIT] == codes
        text = httpx.get(f"{served.admin_url}/metrics", timeout=5).text
    finally:
        served.stop()
    counts = {
        sample.labels["result"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "ratekeeper_decision_latency_seconds_count"
    }
    assert {"allowed": 1, "refused": 2} == counts


# --- a real Prometheus scraping real services --------------------------------------------


def _api(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=5) as reply:
        data = json.load(reply)
    assert "success" == data["status"], data
    return data["data"]


def _finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


class _Load:
    """Sends requests to ``services`` from a thread until stopped: /v1/check of the partner
    and login rules on a few keys (each soon refused) and of the shadow rule, and a gRPC
    ShouldRateLimit."""

    def __init__(self, *services: Served) -> None:
        self.services = services
        self.stop = threading.Event()
        self.answers: dict[int, int] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                for served in self.services:
                    for rule in ("obs.partner", "obs.login", "obs.shadow"):
                        reply = client.post(f"{served.url}/v1/check", json={"rule": rule, "key": f"k{n % 3}"})
                        self.answers[reply.status_code] = self.answers.get(reply.status_code, 0) + 1
                    should_rate_limit(served.grpc_target, envoy_request("obs_envoy", [descriptor(("partner", "p"))]))
                self.stop.wait(0.02)

    def __enter__(self) -> _Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[Served, Served]]:
    healthy = start_server(tmp_path, rules=[RULES, ENVOY])
    # A Redis port nobody listens on: every store call fails, the breaker opens, and
    # --on-error allow answers with fallback decisions.
    down = start_server(
        tmp_path, rules=[RULES, ENVOY], store=f"redis://127.0.0.1:{free_port()}/0", args=["--on-error", "allow"]
    )
    yield healthy, down
    for served in (healthy, down):
        if served.proc.poll() is None:
            served.proc.kill()
            served.proc.wait()


def _prometheus_config(tmp_path: Path, healthy: Served, down: Served) -> Path:
    """The example's configuration, with the test's targets and a 1 s interval."""
    config = yaml.safe_load((EXAMPLES / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    shutil.copy(EXAMPLES / "alerts.yml", tmp_path / "alerts.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    serve_job = jobs["ratekeeper-serve"]
    serve_job["static_configs"] = [
        {"targets": [healthy.admin_url.removeprefix("http://"), down.admin_url.removeprefix("http://")]}
    ]
    config["scrape_configs"] = [serve_job]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_real_prometheus_answers_every_panel_and_alert_query(services: tuple[Served, Served], tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (apt-get install -y prometheus)")
    healthy, down = services
    port = free_port()
    config = _prometheus_config(tmp_path, healthy, down)
    with (tmp_path / "prometheus.log").open("w") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            with _Load(healthy, down) as load:
                panels = _panel_queries()
                empty = [expr for _, expr in panels]

                def answered() -> bool:
                    # Every panel answers with a number once two scrapes hold the load.
                    empty[:] = [e for e in empty if not _finite(_api(port, "query", query=e)["result"])]
                    return not empty

                try:
                    wait_until(answered, timeout=30, what="every panel to answer with data")
                except Exception as exc:
                    raise AssertionError(f"panels without data: {empty}") from exc
            assert load.answers.get(200, 0) > 0 and load.answers.get(429, 0) > 0, load.answers
            by_title: dict[str, list[dict[str, Any]]] = {}
            for title, expr in panels:
                by_title.setdefault(title, []).extend(_api(port, "query", query=expr)["result"])
            assert {"allowed", "refused"} <= {r["metric"]["result"] for r in by_title["Limiter latency: p99"]}
            assert {"obs.partner", "obs.login"} <= {r["metric"]["rule"] for r in by_title["Refused per rule"]}
            assert {"http", "grpc"} == {r["metric"]["transport"] for r in by_title["Requests per transport"]}
            down_instance = down.admin_url.removeprefix("http://")
            breaker = {
                (r["metric"]["instance"], r["metric"]["state"]): r["value"][1] for r in by_title["Breaker state"]
            }
            # The down store's breaker is open or probing (half open), never closed.
            assert "0" == breaker[(down_instance, "closed")]
            assert "1" == breaker[(healthy.admin_url.removeprefix("http://"), "closed")]

            # Every alert expression is valid PromQL; those whose cause the down service
            # shows (without their `for:` wait) select it.
            exprs = _alert_exprs()
            for expr in exprs.values():
                _api(port, "query", query=expr)  # a parse error answers 400: urlopen raises
                # A misspelt metric would parse and stay silent forever: each one it reads exists.
                for name in re.findall(r"\bratekeeper_[a-z_]+", expr):
                    assert _api(port, "query", query=f"count({name})")["result"], f"{name} has no series"
            for name in ("RatekeeperStoreErrors", "RatekeeperBreakerOpen", "RatekeeperFallbackDecisions"):
                instances = {r["metric"]["instance"] for r in _api(port, "query", query=exprs[name])["result"]}
                assert {down_instance} == instances, name
            # Prometheus loaded and evaluated every rule without an error.
            loaded = [r for g in _api(port, "rules")["groups"] for r in g["rules"]]
            assert set(exprs) == {r["name"] for r in loaded}
            wait_until(
                lambda: all(r["health"] == "ok" for g in _api(port, "rules")["groups"] for r in g["rules"]),
                timeout=10,
                what="every rule evaluated",
            )
        finally:
            proc.terminate()
            proc.wait(timeout=20)
