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
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratekeeper.loadtest.process import HOST, ProcessError, ServerProcess, free_port

__all__ = ["OPEN_LIMIT", "Names", "Service", "ServiceError", "rules_files"]

OPEN_LIMIT = 1_000_000_000
"""Per second: the rule that never refuses (every call is still decided and charged)."""

START_TIMEOUT = 30.0
"""Seconds the service may take to answer ``/healthz`` (imports on a busy machine)."""


class ServiceError(ProcessError):
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
        # Not the native rules' prefix: an Envoy rate limit named like a native rule is refused.
        return f"bench-serve-envoy-{self.run_id}"

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


class Service(ServerProcess):
    """One ``ratekeeper serve`` process; ``start``, ``wait_ready``, ``stop``."""

    error = ServiceError
    stop_timeout = 15.0

    def __init__(self, store: str, rules: list[Path], log_path: Path, *, cpu: int | None = None) -> None:
        super().__init__(log_path, cpu=cpu)
        self.store = store
        self.rules = rules
        self.http_port = free_port()
        self.grpc_port = free_port()

    @property
    def grpc_target(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "ratekeeper", "serve", "--store", self.store]
        for path in self.rules:
            command += ["--rules", str(path)]
        ports = ["--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
        # The load touches the decision surface only; no admin listener to find a port for.
        return [*command, "--host", HOST, *ports, "--admin-port", "off"]

    def start(self) -> None:
        """Start the process (without waiting for it: see ``wait_ready``)."""
        self.spawn(self.command())

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
            if self.exited():
                raise ServiceError(f"ratekeeper serve --store {self.store} exited: {self.log_tail()}")
            with contextlib.suppress(OSError):  # not listening yet
                status, _ = self.request("GET", "/readyz")
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise ServiceError(f"ratekeeper serve did not get ready within {timeout:g} s: {self.log_tail()}")
            time.sleep(0.05)

    def runqueue_seconds(self) -> float:
        """Seconds the service's main thread (its event loop) spent runnable but waiting for
        a CPU (the second field of ``/proc/PID/schedstat``): time another process held its
        CPU. 0 where the kernel keeps no schedstat."""
        try:
            return int(Path(f"/proc/{self.pid}/schedstat").read_text().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0
