"""``ratekeeper serve --otel``: a real service exports its metrics and a span per decision
to the exporters the standard OTEL_* variables name (here the SDK's console exporters, on
its stdout), and its /metrics holds the limit gauge of each configured rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from server.conftest import start_server

RULES = """
rules:
  - name: otel.partner
    limits: ["2/minute", "10/hour"]
"""

SECRET = "partner-7d2e-secret"

CONSOLE = {
    "OTEL_TRACES_EXPORTER": "console",
    "OTEL_METRICS_EXPORTER": "console",
    "OTEL_SERVICE_NAME": "ratekeeper-under-test",
}


def _documents(text: str) -> list[dict[str, Any]]:
    """The JSON objects the console exporters printed, each from a line opening with ``{``."""
    decoder = json.JSONDecoder()
    found = []
    position = 0
    while position < len(text):
        if text[position] == "{":
            try:
                document, position = decoder.raw_decode(text, position)
            except json.JSONDecodeError:
                pass
            else:
                found.append(document)
                continue
        next_line = text.find("\n", position)
        if next_line == -1:
            break
        position = next_line + 1
    return found


def test_serve_with_otel_exports_spans_and_metrics_and_never_the_key(tmp_path: Path) -> None:
    served = start_server(tmp_path, rules=[RULES], args=["--otel"], env=CONSOLE)
    try:
        codes = [
            httpx.post(f"{served.url}/v1/check", json={"rule": "otel.partner", "key": SECRET}, timeout=5).status_code
            for _ in range(3)
        ]
        exposition = httpx.get(f"{served.admin_url}/metrics", timeout=5).text
    finally:
        assert 0 == served.stop()  # SIGTERM: the exporters flush what they hold
    assert [200, 200, 429] == codes
    assert 'ratekeeper_rule_limit{limit="2/minute",rule="otel.partner"} 2.0' in exposition
    assert 'ratekeeper_rule_limit_period_seconds{limit="10/hour",rule="otel.partner"} 3600.0' in exposition

    printed = served.stdout.read_text()
    assert SECRET not in printed
    documents = _documents(printed)
    spans = [d for d in documents if d.get("name") == "ratekeeper.decision"]
    assert ["within", "near", "over"] == [s["attributes"]["ratekeeper.outcome"] for s in spans]
    assert {"otel.partner"} == {s["attributes"]["ratekeeper.rule"] for s in spans}
    assert all(s["attributes"]["ratekeeper.store.latency"] > 0 for s in spans)
    assert "ratekeeper-under-test" == spans[0]["resource"]["attributes"]["service.name"]

    instruments: dict[str, list[dict[str, Any]]] = {}
    for document in documents:
        for resource in document.get("resource_metrics", ()):
            for scope in resource["scope_metrics"]:
                for metric in scope["metrics"]:
                    instruments.setdefault(metric["name"], []).extend(metric["data"]["data_points"])
    decisions = {p["attributes"]["outcome"]: p["value"] for p in instruments["ratekeeper.decisions"]}
    assert {"within": 1, "near": 1, "over": 1} == decisions
    assert {"http"} == {p["attributes"]["transport"] for p in instruments["ratekeeper.requests"]}
    limits = {(p["attributes"]["limit"], p["value"]) for p in instruments["ratekeeper.rule_limit"]}
    assert {("2/minute", 2), ("10/hour", 10)} == limits
    assert {"allowed", "refused"} == {p["attributes"]["result"] for p in instruments["ratekeeper.decision_latency"]}


def _refused_start(tmp_path: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``ratekeeper serve ARGS`` on free ports, expected to refuse to start."""
    src = Path(__file__).resolve().parents[2] / "src"
    ports = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0"]
    return subprocess.run(
        [sys.executable, "-m", "ratekeeper", "serve", *args, *ports],
        env={**os.environ, **env, "PYTHONPATH": str(src)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_serve_with_otel_and_an_exporter_not_installed_cannot_start(tmp_path: Path) -> None:
    run = _refused_start(tmp_path, ["--otel"], {**CONSOLE, "OTEL_METRICS_EXPORTER": "nonesuch"})
    assert 2 == run.returncode
    assert "OTEL_METRICS_EXPORTER=nonesuch: no OpenTelemetry exporter of that name is installed" in run.stderr
    assert "Traceback" not in run.stderr


def test_serve_records_the_key_on_spans_only_when_asked_and_counts_refunds(tmp_path: Path) -> None:
    served = start_server(tmp_path, rules=[RULES], args=["--otel", "--otel-record-key"], env=CONSOLE)
    try:
        check = httpx.post(f"{served.url}/v1/check", json={"rule": "otel.partner", "key": SECRET}, timeout=5)
        refund = httpx.post(
            f"{served.admin_url}/v1/refund", json={"rule": "otel.partner", "key": SECRET, "cost": 1}, timeout=5
        )
        exposition = httpx.get(f"{served.admin_url}/metrics", timeout=5).text
    finally:
        assert 0 == served.stop()
    assert 200 == check.status_code
    assert 1 == refund.json()["refunded"]
    assert 'ratekeeper_refunded_cost_total{rule="otel.partner"} 1.0' in exposition
    spans = [d for d in _documents(served.stdout.read_text()) if d.get("name") == "ratekeeper.decision"]
    assert [SECRET] == [s["attributes"]["ratekeeper.key"] for s in spans]


def test_serve_refuses_to_record_keys_without_otel(tmp_path: Path) -> None:
    run = _refused_start(tmp_path, ["--otel-record-key"], {})
    assert 2 == run.returncode
    assert "--otel-record-key puts keys on OpenTelemetry spans: it needs --otel" in run.stderr
    assert "Traceback" not in run.stderr
