"""``ratekeeper bench serve --workers N``: decisions per CPU-second of the service's processes,
one process against N workers (``ratekeeper serve --workers N``) and against a fleet of N
separate ``serve`` processes, all on one Redis.

Throughput on a shared machine says little about the service: the other processes take
its cores. What a worker costs does not change with them: each run counts the decisions
answered (wrk for HTTP ``/v1/check`` over changing keys, h2load for gRPC
``ShouldRateLimit``; N of them at once, the connections split among them) and the CPU
seconds every serving process spent meanwhile (``/proc/PID/stat``: user and system time
of each worker; the supervisor's, which does no request work, is counted too). Setups
alternate round by round, and the median of each is compared with one process's: the
target is at least ``TARGET`` of its decisions per CPU-second.

Two more setups tell the workers' machinery from the load each process gets: one process
under 1/N of the connections (the load each of N workers gets), and N workers under N
times the connections (each worker as loaded as the one process). A process that answers
fewer requests at a time coalesces fewer decisions into each store round trip and pays
more CPU for each; when N workers match one process at the same load per process, what
they lose under the same total load is that, not the workers' machinery.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ratekeeper.loadtest.process import HOST, free_port
from ratekeeper_bench.serve_load import Load, grpc_body, run_h2load, run_wrk, wrk_script
from ratekeeper_bench.serve_service import Names, rules_files

__all__ = ["TARGET", "Measured", "run_workers_bench"]

TARGET = 0.9
"""Decisions per CPU-second of N workers (or N processes), as a share of one process's."""

START_TIMEOUT = 60.0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` (every thread)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class _Serve:
    """One ``ratekeeper serve`` (with ``--workers`` when ``workers`` > 1)."""

    workers: int
    store: str
    rules: list[Path]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    http_port: int = 0
    grpc_port: int = 0

    def start(self) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        command = [sys.executable, "-m", "ratekeeper", "serve", "--store", self.store, "--host", HOST]
        for path in self.rules:
            command += ["--rules", str(path)]
        command += ["--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port), "--admin-port", "off"]
        if self.workers > 1:
            command += ["--workers", str(self.workers)]
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)

    def _events(self, name: str) -> list[dict[str, object]]:
        lines = self.log.read_text(errors="replace").splitlines()
        return [e for e in (json.loads(line) for line in lines if line.startswith("{")) if e.get("event") == name]

    def wait_ready(self) -> list[int]:
        """The pids doing the work once every one serves: the supervisor and its workers."""
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        want = "ready" if self.workers > 1 else "start"
        while not (found := self._events(want)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ratekeeper serve did not start: {self.log.read_text()[-600:]}")
            time.sleep(0.05)
        if self.workers == 1:
            return [self.proc.pid]
        pids = found[0]["pids"]
        assert isinstance(pids, list)
        return [self.proc.pid, *pids]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


@dataclass(frozen=True, slots=True)
class Measured:
    """One setup on one transport: decisions and CPU seconds of one round."""

    setup: str
    transport: str
    decisions: int
    cpu: float
    seconds: float

    @property
    def per_cpu_second(self) -> float:
        return self.decisions / self.cpu if self.cpu > 0 else 0.0


def _load(transport: str, serve: _Serve, names: Names, seconds: int, connections: int) -> Load:
    if transport == "http":
        url = f"http://{HOST}:{serve.http_port}/v1/check"
        return run_wrk(url, wrk_script("check", names.open_rule), seconds=seconds, connections=connections, cpu=None)
    body = grpc_body(names.domain, names.open_key, "client")
    target = f"{HOST}:{serve.grpc_port}"
    return run_h2load(target, body, seconds=seconds, clients=connections, streams=4, warm_up=0, cpu=None)


def _measure(
    setup: str, serves: list[_Serve], transport: str, names: Names, seconds: int, connections: int, generators: int
) -> Measured:
    """``generators`` load generators at once, ``connections`` split evenly among them and
    spread over ``serves`` in turn, and the CPU of every process of ``serves`` meanwhile."""
    pids = [pid for serve in serves for pid in serve.wait_ready()]
    _load(transport, serves[0], names, 1, connections)  # warm every connection path up
    targets = [serves[i % len(serves)] for i in range(generators)]
    each = max(1, connections // generators)
    before = {pid: cpu_seconds(pid) for pid in pids}
    with ThreadPoolExecutor(generators) as pool:
        loads = list(pool.map(lambda s: _load(transport, s, names, seconds, each), targets))
    cpu = sum(cpu_seconds(pid) - before[pid] for pid in pids)
    answered = sum(load.requests - load.errors - load.failed for load in loads)
    return Measured(setup, transport, answered, cpu, max(load.seconds for load in loads))


def run_workers_bench(
    workers: int,
    redis_url: str,
    *,
    seconds: int = 5,
    rounds: int = 3,
    connections: int = 32,
    transports: tuple[str, ...] = ("http", "grpc"),
    out: TextIO = sys.stdout,
) -> list[Measured]:
    """Measure one process, ``workers`` workers and ``workers`` processes, ``rounds`` times
    each (alternating), on every transport; print a table with the ratios and the target."""
    names = Names(uuid.uuid4().hex[:8])
    results: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="rk-bench-workers-") as tmp:
        directory = Path(tmp)
        rules = rules_files(names, directory)
        share, scaled = f"1 process, 1/{workers} load", f"--workers {workers}, {workers}x load"
        setups: dict[str, Callable[[], list[_Serve]]] = {
            "1 process": lambda: [_Serve(1, redis_url, rules, directory / f"{uuid.uuid4().hex}.log")],
            f"--workers {workers}": lambda: [_Serve(workers, redis_url, rules, directory / f"{uuid.uuid4().hex}.log")],
            f"{workers} processes": lambda: [
                _Serve(1, redis_url, rules, directory / f"{uuid.uuid4().hex}.log") for _ in range(workers)
            ],
            share: lambda: [_Serve(1, redis_url, rules, directory / f"{uuid.uuid4().hex}.log")],
            scaled: lambda: [_Serve(workers, redis_url, rules, directory / f"{uuid.uuid4().hex}.log")],
        }
        for round_ in range(rounds):
            for setup, make in setups.items():
                serves = make()
                try:
                    for serve in serves:
                        serve.start()
                    for transport in transports:
                        # Every setup under the same N load generators (one has too little CPU
                        # to keep N workers busy on a small machine); the share setup gets one.
                        if setup == share:
                            measured = _measure(setup, serves, transport, names, seconds, connections // workers, 1)
                        elif setup == scaled:
                            measured = _measure(
                                setup, serves, transport, names, seconds, connections * workers, workers
                            )
                        else:
                            measured = _measure(setup, serves, transport, names, seconds, connections, workers)
                        results.append(measured)
                        print(
                            f"round {round_ + 1} {setup:>22} {transport:>4}: {measured.decisions:>7} decisions, "
                            f"{measured.cpu:6.2f} CPU s, {measured.per_cpu_second:8.0f} per CPU-second",
                            file=out,
                            flush=True,
                        )
                finally:
                    for serve in serves:
                        serve.stop()
    print(render(results, workers), file=out)
    return results


def render(results: list[Measured], workers: int) -> str:
    """The medians per setup and transport, each against one process's, with the target."""
    lines = [
        f"| setup | transport | decisions per CPU-second (median) | vs 1 process | target >= {TARGET}x |",
        "|---|---|---:|---:|---|",
    ]
    for transport in dict.fromkeys(r.transport for r in results):
        base = statistics.median(
            r.per_cpu_second for r in results if r.transport == transport and r.setup == "1 process"
        )
        for setup in dict.fromkeys(r.setup for r in results):
            rate = statistics.median(r.per_cpu_second for r in results if r.transport == transport and r.setup == setup)
            ratio = rate / base if base else 0.0
            verdict = (
                ""
                if setup in ("1 process", f"1 process, 1/{workers} load")
                else ("met" if ratio >= TARGET else "not met")
            )
            lines.append(f"| {setup} | {transport} | {rate:,.0f} | {ratio:.2f}x | {verdict} |")
    return "\n".join(lines)
