"""``ratekeeper serve --workers 2``: two real worker processes behind one port on a real
Redis; the supervisor restarts a killed worker, passes SIGHUP and SIGTERM on, and refuses
the memory store. Every wait is on a log line or an answer, never a fixed sleep."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from servers import RedisServer, wait_until

from .conftest import REDIS_URL, ROOT, Served

WORKERS = 2
STORE = f"{REDIS_URL}?timeout=5"
"""Redis with room for a loaded machine: a slow answer is not what these tests look at."""


def events(served: Served, event: str, **fields: object) -> list[dict[str, object]]:
    return [e for e in served.events() if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())]


def all_ready(served: Served) -> bool:
    return bool(events(served, "ready", workers=WORKERS))


def start_workers(serve: Callable[..., Served], rules: list[str], store: str = STORE) -> Served:
    # admin ports 0: the supervisor picks one free port per worker (a given port P needs P+1 free too)
    return serve(rules=rules, store=store, args=["--workers", str(WORKERS), "--admin-port", "0"], ready=all_ready)


def admin_urls(served: Served) -> list[str]:
    """Each worker's admin surface, as the supervisor's log line lists them."""
    ports = events(served, "supervisor")[0]["admin_ports"]
    assert isinstance(ports, list)
    return [f"http://127.0.0.1:{port}" for port in ports]


def metric(admin_url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{admin_url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def check(served: Served, rule: str, key: str = "k") -> int:
    """One check on a connection of its own, so the kernel picks a worker for each."""
    with httpx.Client(timeout=10) as client:
        return client.post(f"{served.url}/v1/check", json={"rule": rule, "key": key}).status_code


def test_two_workers_serve_one_port_and_both_take_requests(serve: Callable[..., Served], uid: str) -> None:
    served = start_workers(serve, [f'rules:\n  - name: {uid}.wide\n    limits: ["1000/s"]\n'])
    codes = [check(served, f"{uid}.wide", str(i)) for i in range(40)]
    assert [200] * 40 == codes
    counts = [
        metric(url, "ratekeeper_decisions_total", rule=f"{uid}.wide", outcome="within") for url in admin_urls(served)
    ]
    assert 40 == sum(counts)
    assert all(count > 0 for count in counts), counts  # 2**-39 that the kernel sent all to one
    assert 0 == served.stop()


def test_the_partner_scenario_admits_exactly_one_across_workers(serve: Callable[..., Served], uid: str) -> None:
    served = start_workers(serve, [f'rules:\n  - name: {uid}.partner\n    limits: ["1/3s"]\n'])
    together = threading.Barrier(10)
    codes: list[int] = []

    def one() -> None:
        with httpx.Client(timeout=10) as client:
            client.get(f"{served.url}/healthz")  # the connection is open before the barrier
            together.wait()
            codes.append(client.post(f"{served.url}/v1/check", json={"rule": f"{uid}.partner", "key": "p"}).status_code)

    threads = [threading.Thread(target=one) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [200] + [429] * 9 == sorted(codes)
    assert 0 == served.stop()


def test_a_killed_worker_is_started_again_and_the_port_keeps_answering(serve: Callable[..., Served], uid: str) -> None:
    served = start_workers(serve, [f'rules:\n  - name: {uid}.wide\n    limits: ["1000/s"]\n'])
    pids = events(served, "ready")[0]["pids"]
    assert isinstance(pids, list)
    os.kill(pids[0], signal.SIGKILL)
    wait_until(lambda: bool(events(served, "worker", pid=pids[0], state="died")), 20, "the supervisor to see it die")
    assert [200] * 10 == [check(served, f"{uid}.wide", str(i)) for i in range(10)]  # the other worker answers
    wait_until(
        lambda: any(e["pid"] not in pids for e in events(served, "worker", index=0, state="serving")),
        30,
        "worker 0 to serve again",
    )
    assert metric(admin_urls(served)[0], "ratekeeper_requests_total", transport="http") >= 1  # its own admin port
    assert [200] * 10 == [check(served, f"{uid}.wide", str(i)) for i in range(10)]
    assert 0 == served.stop()


def test_sighup_reloads_every_worker(serve: Callable[..., Served], uid: str) -> None:
    served = start_workers(serve, [f'rules:\n  - name: {uid}.a\n    limits: ["10/s"]\n'])
    served.rules[0].write_text(
        f'rules:\n  - name: {uid}.a\n    limits: ["10/s"]\n  - name: {uid}.b\n    limits: ["10/s"]\n'
    )
    served.proc.send_signal(signal.SIGHUP)

    def reloaded() -> list[dict[str, object]]:
        return [e for e in events(served, "reload", ok=True, reason="SIGHUP") if f"{uid}.b" in e["rules"]]  # type: ignore[operator]

    wait_until(lambda: len(reloaded()) == WORKERS, 30, "every worker to reload")
    for url in admin_urls(served):
        names = [rule["name"] for rule in httpx.get(f"{url}/v1/rules", timeout=5).json()["rules"]]
        assert f"{uid}.b" in names
    assert 0 == served.stop()


class Requests:
    """The HTTP requests the workers received, less the scrapes of ``/metrics`` that counted them."""

    def __init__(self, served: Served) -> None:
        self.urls = admin_urls(served)
        self.scrapes = 0
        self.base = self._sum()

    def _sum(self) -> float:
        self.scrapes += 1
        return sum(metric(url, "ratekeeper_requests_total", transport="http") for url in self.urls)

    def since_start(self) -> float:
        return self._sum() - self.base - (self.scrapes - 1) * len(self.urls)


def test_sigterm_stops_every_worker_and_answers_the_request_in_flight(
    serve: Callable[..., Served], redis_server: RedisServer, uid: str
) -> None:
    served = start_workers(
        serve, [f'rules:\n  - name: {uid}.slow\n    limits: ["5/minute"]\n'], f"{redis_server.url}?timeout=30"
    )
    received = Requests(served)
    redis_server.pause()  # the next check waits for the store: a request in flight
    answers: list[int] = []
    in_flight = threading.Thread(target=lambda: answers.append(check(served, f"{uid}.slow")))
    in_flight.start()
    try:
        wait_until(lambda: received.since_start() >= 1, 10, "the check to arrive")
        served.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: bool(events(served, "signal", signal="SIGTERM")), 10, "the supervisor to pass SIGTERM on")
        wait_until(lambda: len(events(served, "stopping", signal="SIGTERM", grace=10.0)) >= WORKERS, 10, "both to stop")

        def refused() -> bool:
            try:
                httpx.get(f"{served.url}/healthz", timeout=2)
            except (httpx.ConnectError, httpx.RemoteProtocolError):
                return True
            return False

        wait_until(refused, 10, "new connections to be refused")
        assert in_flight.is_alive()
    finally:
        redis_server.resume()
    in_flight.join(30)
    assert [200] == answers
    assert 0 == served.proc.wait(30)
    assert len(events(served, "worker", state="stopped", exitcode=0)) == WORKERS


def serve_command(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ratekeeper", "serve", "--workers", "2", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )


def test_memory_store_is_refused_with_what_to_use_instead(tmp_path: Path) -> None:
    done = serve_command(tmp_path, "--http-port", "0", "--grpc-port", "0")
    assert 2 == done.returncode
    assert "memory://" in done.stderr
    assert "redis://" in done.stderr and "postgresql://" in done.stderr
    assert "serving the example rules" not in done.stdout


def test_a_busy_port_is_one_error_before_any_worker_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = serve_command(tmp_path, "--store", REDIS_URL, "--http-port", str(port), "--grpc-port", "0")
    assert 2 == done.returncode
    assert f"cannot bind the decision HTTP port 127.0.0.1:{port}" in done.stderr
    assert '"state":"starting"' not in done.stderr


def test_a_fleet_of_two_serve_processes_on_one_redis_admits_exactly_one(serve: Callable[..., Served], uid: str) -> None:
    rules = f'rules:\n  - name: {uid}.partner\n    limits: ["1/3s"]\n'
    fleet = [serve(rules=[rules], store=STORE) for _ in range(2)]
    together = threading.Barrier(10)
    codes: list[int] = []

    def one(served: Served) -> None:
        with httpx.Client(timeout=10) as client:
            client.get(f"{served.url}/healthz")
            together.wait()
            codes.append(client.post(f"{served.url}/v1/check", json={"rule": f"{uid}.partner", "key": "p"}).status_code)

    threads = [threading.Thread(target=one, args=(fleet[i % 2],)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [200] + [429] * 9 == sorted(codes)
    assert [0, 0] == [served.stop() for served in fleet]
