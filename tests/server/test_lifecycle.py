"""The service as a process: start, defaults, environment, reload, store outages, graceful stop."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from servers import RedisServer, wait_until

from .clients import NOT_SERVING, SERVING, health
from .conftest import ROOT, Served


def metric(served: Served, name: str, **labels: str) -> float:
    text = httpx.get(f"{served.admin_url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


def has_event(served: Served, event: str, **fields: object) -> bool:
    return any(e.get("event") == event and all(e.get(k) == v for k, v in fields.items()) for e in served.events())


def test_without_options_it_serves_and_prints_the_example_rules_ports_from_the_environment(
    serve: Callable[..., Served],
) -> None:
    served = serve(ports_from_env=True)
    printed = served.stdout.read_text()
    assert "name: items.list" in printed
    assert "domain: example" in printed
    reply = httpx.post(f"{served.url}/v1/check", json={"rule": "auth.create_token", "key": "10.0.0.7"}, timeout=5)
    assert 200 == reply.status_code
    assert SERVING == health(served.grpc_target)
    start = next(e for e in served.events() if e["event"] == "start")
    assert "memory://" == start["store"]
    assert ["items.list", "auth.create_token"] == start["rules"]
    assert 0 == served.stop(signal.SIGINT)


def test_sigterm_lets_the_request_in_flight_finish_then_exits_0(
    serve: Callable[..., Served], redis_server: RedisServer, uid: str
) -> None:
    rules = f'rules:\n  - name: {uid}.slow\n    limits: ["5/minute"]\n'
    served = serve(rules=[rules], store=f"{redis_server.url}?timeout=30")
    before = metric(served, "ratekeeper_requests_total", transport="http")
    redis_server.pause()  # the next check waits for the store: a request in flight
    answers: list[int] = []
    worker = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{served.url}/v1/check", json={"rule": f"{uid}.slow", "key": "k"}, timeout=60).status_code
        )
    )
    worker.start()
    try:
        # /metrics counts a request when it arrives: +1 for the scrape, +1 for the check
        wait_until(lambda: metric(served, "ratekeeper_requests_total", transport="http") >= before + 3, 10, "the check")
        served.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: has_event(served, "stopping", signal="SIGTERM"), 10, "the stopping log line")

        def refused() -> bool:
            try:
                httpx.get(f"{served.url}/healthz", timeout=2)
            except (httpx.ConnectError, httpx.RemoteProtocolError):
                return True
            return False

        wait_until(refused, 10, "new requests to be refused")  # the listener closes...
        assert worker.is_alive()  # ...while the check is still in flight
    finally:
        redis_server.resume()
        worker.join(timeout=30)
    assert [200] == answers
    assert 0 == served.proc.wait(timeout=30)
    assert has_event(served, "stop", signal="SIGTERM")


def test_a_store_outage_turns_ready_and_health_down_and_back(
    serve: Callable[..., Served], redis_server: RedisServer, uid: str
) -> None:
    rules = f'rules:\n  - name: {uid}.r\n    limits: ["5/minute"]\n'
    served = serve(rules=[rules], store=f"{redis_server.url}?timeout=1")
    assert 200 == httpx.get(f"{served.url}/readyz", timeout=5).status_code
    redis_server.stop()
    wait_until(lambda: NOT_SERVING == health(served.grpc_target), 15, "NOT_SERVING")
    ready = httpx.get(f"{served.url}/readyz", timeout=5)
    assert 503 == ready.status_code
    assert "application/problem+json" == ready.headers["content-type"]
    assert "store is not reachable" in ready.json()["detail"]
    check = httpx.post(f"{served.url}/v1/check", json={"rule": f"{uid}.r", "key": "k"}, timeout=5)
    assert 503 == check.status_code  # on_error=raise: the store's failure, said as a problem
    assert "the store failed" in check.json()["detail"]
    assert has_event(served, "store", reachable=False)
    for _ in range(5):  # consecutive failures open the circuit breaker: logged and exported
        httpx.post(f"{served.url}/v1/check", json={"rule": f"{uid}.r", "key": "k"}, timeout=5)
    wait_until(lambda: has_event(served, "breaker", new="open"), 10, "the breaker to open")
    assert 0 == metric(served, "ratekeeper_breaker_state", state="closed")  # open, or half-open probing
    redis_server.start()
    wait_until(lambda: SERVING == health(served.grpc_target), 20, "SERVING again")
    assert 200 == httpx.get(f"{served.url}/readyz", timeout=5).status_code
    assert has_event(served, "store", reachable=True)
    assert 0 == served.stop()


def test_rules_reload_on_change_and_sighup_and_a_broken_file_keeps_the_old_rules(
    serve: Callable[..., Served], uid: str
) -> None:
    first = f'rules:\n  - name: {uid}.a\n    limits: ["1/minute"]\n'
    served = serve(rules=[first])
    path = served.rules[0]
    assert 200 == httpx.post(f"{served.url}/v1/check", json={"rule": f"{uid}.a", "key": "k"}, timeout=5).status_code

    def names() -> list[str]:
        return [r["name"] for r in httpx.get(f"{served.admin_url}/v1/rules", timeout=5).json()["rules"]]

    path.write_text(first + f'  - name: {uid}.b\n    limits: ["2/minute"]\n')
    wait_until(lambda: [f"{uid}.a", f"{uid}.b"] == names(), 15, "the changed file to load")
    assert has_event(served, "reload", ok=True, reason="file changed")
    # the state of the unchanged rule is kept
    assert 429 == httpx.post(f"{served.url}/v1/check", json={"rule": f"{uid}.a", "key": "k"}, timeout=5).status_code

    path.write_text('rules:\n  - name: broken\n    limits: ["five per fortnight"]\n')
    served.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: has_event(served, "reload", ok=False), 15, "the refused reload")
    assert [f"{uid}.a", f"{uid}.b"] == names()
    assert metric(served, "ratekeeper_config_reloads_total", result="failed") >= 1
    assert metric(served, "ratekeeper_config_reloads_total", result="ok") >= 1
    refused = next(e for e in served.events() if e.get("event") == "reload" and e.get("ok") is False)
    assert str(path) in str(refused["error"])
    assert 0 == served.stop()


def test_a_broken_rules_file_stops_the_start_with_exit_2_and_the_problem(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text('rules:\n  - name: x\n    limits: ["5/fortnight"]\n')
    out = subprocess.run(
        [sys.executable, "-m", "ratekeeper", "serve", "--rules", str(broken), "--http-port", "0", "--grpc-port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert 2 == out.returncode
    assert f"{broken}:3" in out.stderr
