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
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ratekeeper.loadtest.process import HOST, ProcessError, ServerProcess, free_port, tree_cpu_seconds
from ratekeeper_bench.web_apps import PATH, AppConfig

__all__ = ["FRAMEWORKS", "HOST", "Framework", "Server", "ServerError", "free_port", "tree_cpu_seconds"]

START_TIMEOUT = 30.0
"""Seconds a server may take to answer its first request (imports on a busy machine)."""


class ServerError(ProcessError):
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


class Server(ServerProcess):
    """One server process for one ``AppConfig``; a context manager that stops it on exit."""

    error = ServerError

    def __init__(self, framework: Framework, config: AppConfig, log_dir: Path, *, cpu: int | None = None) -> None:
        self.framework = framework
        self.config = config
        self.port = free_port()
        super().__init__(log_dir / f"{framework.name}-{config.variant}-{self.port}.log", cpu=cpu)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}{PATH}"

    def start(self) -> None:
        """Start the process (without waiting for it: see ``wait_ready``)."""
        self.spawn(self.framework.command(self.port), {**os.environ, **self.config.to_env(), "PYTHONUNBUFFERED": "1"})

    def log_tail(self, lines: int = 15) -> str:
        return super().log_tail(lines)

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
            if self.exited():
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
