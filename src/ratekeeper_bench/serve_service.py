"""The ``ratekeeper serve`` process that ``ratekeeper bench serve`` loads, and its rules.

``rules_files`` writes the run's two rules files (native and Envoy form), each with a
rule that never refuses at these rates and one spent by the first call; ``Service``
starts ``python -m ratekeeper serve`` on them as it is run in production (one process,
uvicorn with httptools and uvloop, ``grpc.aio`` on the same event loop), optionally
pinned to one CPU with ``taskset``, on spare loopback ports, and stops it with SIGTERM.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ratekeeper_bench.web_apps.servers import HOST, free_port, tree_cpu_seconds

__all__ = ["OPEN_LIMIT", "Names", "Service", "ServiceError", "rules_files"]

OPEN_LIMIT = 1_000_000_000
"""Per second: the rule that never refuses (every call is still decided and charged)."""

START_TIMEOUT = 30.0
"""Seconds the service may take to answer ``/healthz`` (imports on a busy machine)."""


class ServiceError(RuntimeError):
    """The service did not start, or answered what it should not have."""


@dataclass(frozen=True, slots=True)
class Names:
    """The run's rule names and Envoy domain (unique per run, so a shared Redis is safe)."""

    run_id: str

    @property
    def open_rule(self) -> str:
        return f"bench-serve-{self.run_id}.open"

    @property
    def denied_rule(self) -> str:
        return f"bench-serve-{self.run_id}.denied"

    @property
    def domain(self) -> str:
        return f"bench-serve-{self.run_id}"

    open_key = "client"
    """The Envoy descriptor key limited at ``OPEN_LIMIT`` per second, one bucket per value."""
    denied_key = "denied"
    """The Envoy descriptor key limited at 1 per hour, one bucket per value."""


def rules_files(names: Names, directory: Path) -> list[Path]:
    """Write the native and the Envoy rules file of the run into ``directory``; their paths."""
    native = directory / "rules.yaml"
    native.write_text(
        "rules:\n"
        f"  - name: {names.open_rule}\n"
        f'    limits: ["{OPEN_LIMIT}/s"]\n'
        f"  - name: {names.denied_rule}\n"
        '    limits: ["1/h"]\n',
        encoding="utf-8",
    )
    envoy = directory / "envoy.yaml"
    envoy.write_text(
        f"domain: {names.domain}\n"
        "descriptors:\n"
        f"  - key: {names.open_key}\n"
        f"    rate_limit: {{unit: second, requests_per_unit: {OPEN_LIMIT}}}\n"
        f"  - key: {names.denied_key}\n"
        "    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        encoding="utf-8",
    )
    return [native, envoy]


class Service:
    """One ``ratekeeper serve`` process; ``start``, ``wait_ready``, ``stop``."""

    def __init__(self, store: str, rules: list[Path], log_path: Path, *, cpu: int | None = None) -> None:
        self.store = store
        self.rules = rules
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.cpu = cpu
        self.log_path = log_path
        self._log: IO[bytes] | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def grpc_target(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise ServiceError("the service is not running")
        return self._process.pid

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "ratekeeper", "serve", "--store", self.store]
        for path in self.rules:
            command += ["--rules", str(path)]
        command += ["--host", HOST, "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
        return ["taskset", "-c", str(self.cpu), *command] if self.cpu is not None else command

    def start(self) -> None:
        """Start the process (without waiting for it: see ``wait_ready``)."""
        self._log = self.log_path.open("wb")
        self._process = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT)

    def log_tail(self, lines: int = 10) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return " / ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request on a fresh connection: the status and the JSON answer."""
        conn = http.client.HTTPConnection(HOST, self.http_port, timeout=10)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {} if body is None else {"Content-Type": "application/json"}
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            conn.close()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until ``/readyz`` answers 200 (the store answers), or ``ServiceError``."""
        deadline = time.monotonic() + timeout
        status = 0
        while True:
            if self._process is None or self._process.poll() is not None:
                raise ServiceError(f"ratekeeper serve --store {self.store} exited: {self.log_tail()}")
            with contextlib.suppress(OSError):  # not listening yet
                status, _ = self.request("GET", "/readyz")
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise ServiceError(f"ratekeeper serve did not get ready within {timeout:g} s: {self.log_tail()}")
            time.sleep(0.05)

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.pid)

    def runqueue_seconds(self) -> float:
        """Seconds the service's main thread (its event loop) spent runnable but waiting for
        a CPU (the second field of ``/proc/PID/schedstat``): time another process held its
        CPU. 0 where the kernel keeps no schedstat."""
        try:
            return int(Path(f"/proc/{self.pid}/schedstat").read_text().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
