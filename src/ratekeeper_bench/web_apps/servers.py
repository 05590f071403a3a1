"""Starting, probing and stopping the servers that ``ratekeeper bench web`` loads.

Starlette runs under uvicorn (one process, httptools, uvloop, no access log); Flask and
Django under gunicorn (one gthread worker with one thread: it keeps connections alive as
uvicorn does, where the sync worker closes each one; no access log). Each server runs the factory of
its framework's module with an ``AppConfig`` in its environment, on a spare loopback
port, optionally pinned to one CPU with ``taskset``; its output goes to a log file whose
tail explains a server that failed to start.
"""

from __future__ import annotations

import http.client
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Self

from ratekeeper_bench.web_apps import PATH, AppConfig

__all__ = ["FRAMEWORKS", "HOST", "Framework", "Server", "ServerError", "free_port", "tree_cpu_seconds"]

HOST = "127.0.0.1"
START_TIMEOUT = 30.0
"""Seconds a server may take to answer its first request (imports on a busy machine)."""


class ServerError(RuntimeError):
    """A server did not start, or stopped answering."""


@dataclass(frozen=True, slots=True)
class Framework:
    """A web framework, the server that runs it and how that server is started."""

    name: str
    server: str
    """How it is served, as the report says it."""
    factory: str

    def command(self, port: int) -> list[str]:
        if self.server.startswith("uvicorn"):
            return [
                sys.executable, "-m", "uvicorn", "--factory", self.factory,
                "--host", HOST, "--port", str(port), "--workers", "1",
                "--http", "httptools", "--loop", "uvloop", "--no-access-log", "--log-level", "warning",
            ]  # fmt: skip
        return [
            sys.executable, "-m", "gunicorn", "--workers", "1", "--worker-class", "gthread", "--threads", "1",
            "--bind", f"{HOST}:{port}", "--log-level", "warning", self.factory,
        ]  # fmt: skip


_APPS = "ratekeeper_bench.web_apps"
FRAMEWORKS: dict[str, Framework] = {
    f.name: f
    for f in (
        Framework("starlette", "uvicorn, 1 process, httptools, uvloop", f"{_APPS}.starlette_app:create_app"),
        Framework("flask", "gunicorn, 1 gthread worker, 1 thread", f"{_APPS}.flask_app:create_app()"),
        Framework("django", "gunicorn, 1 gthread worker, 1 thread", f"{_APPS}.django_app:create_app()"),
    )
}


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A loopback port nobody listens on right now, outside the ephemeral range when it can be.

    A port that the kernel hands out for outgoing connections (port 0 comes from that
    range) can be taken by one, a Redis client's say, between this check and the
    server's bind; ports below the range are never taken that way.
    """
    low, high = _ephemeral_range()
    candidates = range(20_000, low) if low > 21_000 else range(high + 1, 65_536)
    for _ in range(100):
        port = random.choice(candidates) if len(candidates) else 0
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and all its descendants (from ``/proc``).

    A gunicorn master's work is done by its worker, a child: the tree counts both.
    Processes that vanish while being read are skipped.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    pending = [pid]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            stat = Path(f"/proc/{current}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total / ticks


class Server:
    """One server process for one ``AppConfig``; a context manager that stops it on exit."""

    def __init__(self, framework: Framework, config: AppConfig, log_dir: Path, *, cpu: int | None = None) -> None:
        self.framework = framework
        self.config = config
        self.port = free_port()
        self.cpu = cpu
        self.log_path = log_dir / f"{framework.name}-{config.variant}-{self.port}.log"
        self._log: IO[bytes] | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}{PATH}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise ServerError("the server is not running")
        return self._process.pid

    def start(self) -> None:
        """Start the process (without waiting for it: see ``wait_ready``)."""
        command = self.framework.command(self.port)
        if self.cpu is not None:
            command = ["taskset", "-c", str(self.cpu), *command]
        env = {**os.environ, **self.config.to_env(), "PYTHONUNBUFFERED": "1"}
        self._log = self.log_path.open("wb")
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return " / ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def get(self, timeout: float = 10.0) -> int:
        """One GET of the endpoint on a fresh connection: its status."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            conn.request("GET", PATH)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def wait_ready(self, timeout: float = START_TIMEOUT, attempts: int = 3) -> int:
        """Wait until the endpoint answers (the status of that first answer), or ``ServerError``.

        A server that exits because its port was taken meanwhile is started again on
        another port, up to ``attempts`` starts in all.
        """
        deadline = time.monotonic() + timeout
        while True:
            if self._process is None or self._process.poll() is not None:
                tail = self.log_tail()
                if attempts > 1 and "in use" in tail.lower():
                    self.stop()
                    self.port = free_port()
                    self.start()
                    return self.wait_ready(timeout, attempts - 1)
                raise ServerError(f"{self.framework.name} {self.config.variant} exited: {tail}")
            try:
                # A short timeout: whoever else holds the port may accept and never answer.
                return self.get(timeout=1.0)
            except OSError:
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"{self.framework.name} {self.config.variant} did not answer within {timeout:g} s: "
                        f"{self.log_tail()}"
                    ) from None
                time.sleep(0.05)

    def probe(self, requests: int = 3) -> tuple[int, ...]:
        """The statuses of ``requests`` GETs, one after another."""
        return tuple(self.get() for _ in range(requests))

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.pid)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
