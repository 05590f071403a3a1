"""The tour from start to end: the service started, the scenarios run one after the
other (their findings printed as each ends), the load test's outputs and charts written,
then the service kept serving until Ctrl-C (or stopped at once with ``exit_after``)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import aiohttp

from ratekeeper.loadtest.charts import write_charts
from ratekeeper.loadtest.engine import RunResult
from ratekeeper.loadtest.memory import RssSampler
from ratekeeper.loadtest.outputs import write_outputs
from ratekeeper.loadtest.profiles import Plan, Profile, Stage
from ratekeeper.tour.rules import STORE_MAX_KEYS, write_rules
from ratekeeper.tour.scenarios import SCENARIOS, Client, Finding, Pace
from ratekeeper.tour.service import Addresses, ServiceError, TourService

__all__ = ["TourOptions", "run_tour"]

INTERRUPTED = 130
"""The exit status of a tour stopped before its end (a shell's for a program SIGINT ended)."""
CALLERS = 128
"""Connections the tour's client may hold open: more than any scenario's callers."""
TIMEOUT = 10.0
"""Seconds one check may take before the tour counts it as failed."""


@dataclass(frozen=True, slots=True)
class TourOptions:
    """What ``ratekeeper tour`` was told."""

    out: Path
    http_port: int = 8080
    grpc_port: str = "8081"
    admin_port: int = 8082
    quick: bool = False
    exit_after: bool = False


def run_tour(options: TourOptions) -> int:
    """Run the tour; 0 when it ran and the service stopped cleanly, 2 when the service
    could not start or a scenario's request failed."""
    out = options.out
    rules = write_rules(out)
    service = TourService(
        [
            *("--rules", str(rules[0]), "--rules", str(rules[1])),
            *("--store", f"memory://?max_keys={STORE_MAX_KEYS}"),
            *("--http-port", str(options.http_port), "--grpc-port", options.grpc_port),
            *("--admin-port", str(options.admin_port)),
        ],
        out / "service.log",
    )
    print(f"Starting the service: ratekeeper serve --rules {rules[0]} --rules {rules[1]} (the memory store)")
    serving = False
    with _sigterm_as_interrupt():
        try:
            addresses = service.start()
            print(f"Serving decisions on {addresses.http}, the admin surface on {addresses.admin}\n", flush=True)
            findings = asyncio.run(_scenarios(addresses, service.pid, Pace.quick() if options.quick else Pace(), out))
            failed = sum(f.errors for f in findings)
            if options.exit_after or failed:
                status = service.stop()
                return 2 if failed else status
            _print_serving(addresses, out)
            serving = True
            return service.wait()
        except ServiceError as exc:
            print(f"ratekeeper tour: {exc}")
            return 2
        except KeyboardInterrupt:  # Ctrl-C reached the service too: it stops by itself
            return 0 if serving else INTERRUPTED
        finally:
            service.stop()


async def _scenarios(addresses: Addresses, pid: int, pace: Pace, out: Path) -> list[Finding]:
    findings: list[Finding] = []
    sampler = RssSampler(pid)
    started, t0 = time.time(), time.monotonic()
    sampler.start(t0)
    connector = aiohttp.TCPConnector(limit=CALLERS)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as session:
        client = Client(session, addresses.http, addresses.admin)
        try:
            for number, scenario in enumerate(SCENARIOS, 1):
                finding: Finding = await scenario(client, pace, pid)
                findings.append(finding)
                print(f"{number}. {finding.text()}\n", flush=True)
        finally:
            await sampler.stop()
    _write(findings, addresses, RunResult(_plan(addresses, findings), {}, started, time.monotonic() - t0), sampler, out)
    return findings


def _plan(addresses: Addresses, findings: list[Finding]) -> Plan:
    """The scenarios as the load test's profiles, so its outputs and charts describe them."""
    return Plan(
        addresses.http,
        tuple(
            Profile(f.recorder.name, (Stage(1.0, f.recorder.seconds),), path="/v1/check", method="POST",
                    expect=f.recorder.expect)
            for f in findings
        ),
    )  # fmt: skip


def _write(findings: list[Finding], addresses: Addresses, result: RunResult, sampler: RssSampler, out: Path) -> None:
    result.stats.update({f.recorder.name: f.recorder.stats for f in findings})
    result.rss.extend(sampler.samples)
    summary = write_outputs(result, out)
    charts = write_charts(result, summary, out)
    found = [{"scenario": f.recorder.name, "title": f.title, "lines": f.lines, **f.numbers} for f in findings]
    (out / "findings.json").write_text(json.dumps(found, indent=2) + "\n")
    print("Charts: " + ", ".join(str(path) for path in charts))
    print(f"Per second and per scenario: {out / 'results.tsv'}; the findings: {out / 'findings.json'}\n", flush=True)


def _print_serving(addresses: Addresses, out: Path) -> None:
    check = f"curl -i {addresses.http}/v1/check -H 'content-type: application/json'"
    lines = [
        "The service keeps serving the tour's rules (edit them and it reloads them):",
        f"  status page     {addresses.admin}/",
        f'  decisions       {check} -d \'{{"rule": "items.list", "key": "alice"}}\'',
        f"  metrics         {addresses.admin}/metrics",
    ]
    if addresses.grpc:
        lines.append(f"  Envoy (gRPC)    {addresses.grpc}")
    lines += [
        f"  rules           {out / 'rules.yaml'}, {out / 'envoy.yaml'}",
        f"  log             {out / 'service.log'}",
    ]
    lines.append("Stop it with Ctrl-C.")
    print("\n".join(lines), flush=True)


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the tour as Ctrl-C does, so the service it started is stopped too."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
