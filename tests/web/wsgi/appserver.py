"""Real HTTP servers for the web tests: gunicorn (WSGI) and uvicorn (ASGI) as subprocesses.

``AppServer`` starts the venv's server on a free loopback port with the test package on
its path and the app's configuration in the environment (``RK_WEB_CONFIG``: JSON read by
``web.wsgi.config``), and waits until the port accepts connections and the app answers
``GET /health`` (every worker imports the app before that). Its exit stops the process
group and, when the test failed, the log tail is in the exception.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self

import httpx

from ratekeeper.loadtest.process import free_port

__all__ = ["AppServer", "free_port"]

HOST = "127.0.0.1"
TESTS_DIR = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
START_TIMEOUT = 30.0
BIND_ATTEMPTS = 3
"""A port found free can still be taken before the server binds it: it then retries on another."""


class AppServer:
    """One server process serving ``target`` (``module:attribute``) with ``config``.

    ``kind`` is ``"gunicorn"`` (sync workers, ``workers`` of them) or ``"uvicorn"``.
    ``url`` is the base URL once started.
    """

    def __init__(
        self,
        target: str,
        config: dict[str, Any],
        log_dir: Path,
        *,
        kind: str = "gunicorn",
        workers: int = 1,
        env: dict[str, str] | None = None,
        name: str = "",
    ) -> None:
        self.name = name or target
        self.target = target
        self.config = config
        self.kind = kind
        self.workers = workers
        self.log_dir = log_dir
        self._take_port()
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def _take_port(self) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log_path = self.log_dir / f"{self.kind}-{self.port}.log"

    def command(self) -> list[str]:
        if self.kind == "gunicorn":
            return [
                str(BIN / "gunicorn"),
                "--bind",
                f"{HOST}:{self.port}",
                "--workers",
                str(self.workers),
                "--worker-class",
                "sync",
                "--graceful-timeout",
                "2",
                "--chdir",
                str(TESTS_DIR),
                self.target,
            ]
        if self.kind == "uvicorn":
            return [
                str(BIN / "uvicorn"),
                "--host",
                HOST,
                "--port",
                str(self.port),
                "--app-dir",
                str(TESTS_DIR),
                "--lifespan",
                "off",
                "--no-proxy-headers",  # the middleware reads the forwarding headers, not uvicorn
                "--no-access-log",
                *(["--workers", str(self.workers)] if self.workers > 1 else []),
                self.target,
            ]
        raise ValueError(f"unknown server kind {self.kind!r}")

    def start(self, attempts: int = BIND_ATTEMPTS) -> Self:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS_DIR), env.get("PYTHONPATH", "")) if p)
        env["RK_WEB_CONFIG"] = json.dumps(self.config)
        env.update(self.extra_env)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                if attempts > 1 and "in use" in self.log_tail().lower():
                    self.proc = None
                    self._take_port()
                    return self.start(attempts - 1)
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass  # not accepting yet
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.kind} did not answer within {START_TIMEOUT}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
