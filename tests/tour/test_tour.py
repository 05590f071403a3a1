"""``ratekeeper tour``: the real command in quick mode, on free ports, against the real
service it starts; what it prints is what its scenarios measured, its charts are PNGs,
and it either stops (``--exit``) or keeps serving until it is told to stop."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from ratekeeper.cli import build_parser
from ratekeeper.config import load_any
from ratekeeper.config.envoy import EnvoyConfig
from ratekeeper.config.model import RuleSet
from ratekeeper.tour.rules import FAILSAFE, HOT_LIMIT, PLANS, plan_of, write_rules
from ratekeeper.tour.scenarios import FAILED, Client, Recorder, Reply, counted, decision_time

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FREE_PORTS = ["--http-port", "0", "--grpc-port", "0", "--admin-port", "0"]
Tour = tuple[subprocess.CompletedProcess[str], Path]


def tour_command(out: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "ratekeeper", "tour", "--quick", "--out", str(out), *FREE_PORTS, *options]


@pytest.fixture(scope="module")
def quick_tour(tmp_path_factory: pytest.TempPathFactory) -> Tour:
    out = tmp_path_factory.mktemp("tour")
    done = subprocess.run(tour_command(out, "--exit"), check=False, capture_output=True, text=True, timeout=100)
    return done, out


def findings(out: Path) -> dict[str, dict[str, Any]]:
    return {entry["scenario"].split(":")[0]: entry for entry in json.loads((out / "findings.json").read_text())}


def test_the_quick_tour_exits_0_and_stops_its_service(quick_tour: Tour) -> None:
    done, out = quick_tour
    assert 0 == done.returncode, done.stdout + done.stderr
    events = [json.loads(line)["event"] for line in (out / "service.log").read_text().splitlines()]
    assert "start" in events and "stop" == events[-1]
    assert "Stop it with Ctrl-C" not in done.stdout


def test_the_partner_scenario_admits_one_in_each_window(quick_tour: Tour) -> None:
    done, out = quick_tour
    partner = findings(out)["partner"]
    assert 2 == partner["windows"] == partner["admitted"]
    assert partner["refused"] > 0
    assert all(gap >= 1.9 for gap in partner["gaps_s"])  # 2 s on the service's clock, less the client's jitter
    assert "2 windows of 2 s: 2 admitted, one in each" in done.stdout


def test_the_login_bursts_are_stopped_at_5_by_the_short_limit(quick_tour: Tour) -> None:
    done, out = quick_tour
    bursts = findings(out)["login"]["bursts"]
    assert [5, 5] == [b["admitted"] for b in bursts]
    assert [3, 3] == [b["refused"] for b in bursts]
    assert [["5/3s"], ["5/3s"]] == [b["denied_by"] for b in bursts]
    assert "burst 1 at 0.00 s: 5 admitted, 3 refused by 5/3s (retry in 3.0 s)" in done.stdout


def test_the_hot_key_admits_exactly_its_limit(quick_tour: Tour) -> None:
    done, out = quick_tour
    hot = findings(out)["hot key"]
    limit = int(HOT_LIMIT.split("/")[0])
    assert limit == hot["admitted"] == hot["limit"]
    assert hot["sent"] - limit == hot["refused"] > 0
    assert limit == sum(n for outcome, n in hot["service_counted"].items() if outcome != "over")
    assert hot["refused"] == hot["service_counted"]["over"]
    latency = hot["latency_ms"]
    assert 0 < latency["p50_ms"] <= latency["p90_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    assert f"exactly {limit:,} admitted, {hot['refused']:,} refused" in done.stdout


def test_the_flood_admits_each_account_its_plan_and_reads_the_services_memory(quick_tour: Tour) -> None:
    done, out = quick_tour
    flood = findings(out)["flood"]
    plan = int(FAILSAFE.split("/")[0])
    assert [plan] == flood["admitted_per_account"]
    assert plan * flood["accounts"] == flood["admitted"] and flood["accounts"] == flood["refused"]
    assert flood["rss_bytes"] and all(b > 0 for b in flood["rss_bytes"])
    assert f"every account admitted exactly {plan}" in done.stdout and "service memory (RSS)" in done.stdout


def test_the_charts_and_the_load_tests_outputs_are_written(quick_tour: Tour) -> None:
    _, out = quick_tour
    for name in ("rates.png", "latencies.png", "memory.png"):
        assert PNG_SIGNATURE == (out / name).read_bytes()[:8], name
    rows = (out / "results.tsv").read_text().splitlines()
    assert {"partner", "login", "hot key", "flood"} == {row.split(":")[0] for row in rows[1:]}
    summary = json.loads((out / "summary.json").read_text())
    assert 4 == len(summary["profiles"]) and summary["rss_bytes"]


def test_the_tour_keeps_serving_until_it_is_stopped(tmp_path: Path) -> None:
    command = tour_command(tmp_path)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as process:
        try:
            assert process.stdout is not None
            printed = []
            for line in process.stdout:  # the tour prints the addresses, then waits
                printed.append(line)
                if line.startswith("Stop it with Ctrl-C"):
                    break
            text = "".join(printed)
            status_page = re.search(r"status page\s+(\S+)", text)
            decisions = re.search(r"curl -i (\S+)/v1/check", text)
            assert status_page and decisions, text
            assert 200 == httpx.get(status_page[1], timeout=5).status_code
            body = {"rule": "api.calls", "key": "carol@example.com"}
            assert 200 == httpx.post(f"{decisions[1]}/v1/check", json=body, timeout=5).status_code
            process.send_signal(signal.SIGTERM)
            assert 0 == process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
    events = [json.loads(line)["event"] for line in (tmp_path / "service.log").read_text().splitlines()]
    assert "stop" == events[-1]


def test_a_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        command = [sys.executable, "-m", "ratekeeper", "tour", "--quick", "--exit", "--out", str(tmp_path)]
        command += ["--http-port", port, "--grpc-port", "0", "--admin-port", "0"]
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert 2 == done.returncode
    assert "the service did not start" in done.stdout and port in done.stdout


def test_the_quota_provider_answers_a_plan_or_the_failsafe() -> None:
    assert PLANS["carol@example.com"] == plan_of("carol@example.com")
    assert FAILSAFE == plan_of("flood-1@example.com")


def test_the_rules_files_load_and_keep_the_example_rules(tmp_path: Path) -> None:
    native, envoy = write_rules(tmp_path)
    rules, domain = load_any(native), load_any(envoy)
    assert isinstance(rules, RuleSet) and isinstance(domain, EnvoyConfig)
    assert ["items.list", "auth.create_token", "tenant.requests", "api.calls"] == [r.name for r in rules.rules]
    assert "example" == domain.domain


def test_the_metrics_readers() -> None:
    metrics = (
        'ratekeeper_decisions_total{rule="a",outcome="within"} 7.0\n'
        'ratekeeper_decisions_total{rule="a",outcome="over"} 3.0\n'
        'ratekeeper_decisions_total{rule="b",outcome="within"} 1.0\n'
        'ratekeeper_decision_latency_seconds_sum{result="allowed"} 0.5\n'
        'ratekeeper_decision_latency_seconds_count{result="allowed"} 8.0\n'
        'ratekeeper_decision_latency_seconds_sum{result="refused"} 0.25\n'
        'ratekeeper_decision_latency_seconds_count{result="refused"} 3.0\n'
    )
    assert {"within": 7, "over": 3} == counted(metrics, "a")
    assert (0.75, 11) == decision_time(metrics)


def test_the_command_line() -> None:
    args = build_parser().parse_args(["tour"])
    assert (8080, "8081", 8082, Path("ratekeeper-tour")) == (args.http_port, args.grpc_port, args.admin_port, args.out)
    assert not args.quick and not args.exit_after
    assert "off" == build_parser().parse_args(["tour", "--grpc-port", "OFF"]).grpc_port
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tour", "--http-port", "70000"])


def test_a_check_without_an_answer_is_counted_as_an_error() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening: refused

        async def check() -> Reply:
            async with aiohttp.ClientSession() as session:
                return await Client(session, nobody, nobody).check(recorder, "items.list", "alice")

        recorder = Recorder("nobody")
        reply = asyncio.run(check())
    assert FAILED == reply.status and not reply.allowed
    assert 1 == recorder.stats.totals()["errors"]
