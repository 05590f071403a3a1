"""The service the tour runs against: ``ratekeeper serve`` as a child process, so the
tour's own requests never share a CPU with the decisions they measure, and the service's
memory is its own process's (``/proc/PID/status``).

The child's log (JSON lines on stderr) is copied to a file by a reader thread, which also
picks out the ``start`` event: the addresses the service listens on (ports 0 become the
ports it was given) and the moment it is ready.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["Addresses", "ServiceError", "TourService"]

START_TIMEOUT = 60.0
"""Seconds the child may take to listen (importing grpc and uvicorn on a busy machine)."""
TAIL = 5
"""The child's last lines of output kept to explain a failed start."""
STOP_TIMEOUT = 15.0
"""Seconds between SIGTERM and SIGKILL: the service's own grace is 10 s."""


class ServiceError(RuntimeError):
    """The service did not start, or ended while the tour needed it."""


@dataclass(frozen=True, slots=True)
class Addresses:
    """Where the service listens, from its ``start`` log line."""

    http: str
    admin: str
    grpc: str | None


class TourService:
    """``ratekeeper serve`` with the given arguments, its log in ``log_path``."""

    def __init__(self, serve_args: list[str], log_path: Path) -> None:
        self.serve_args = serve_args
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None
        self._started = threading.Event()
        self._start: dict[str, Any] | None = None
        self._reader: threading.Thread | None = None
        self._tail: deque[bytes] = deque(maxlen=TAIL)

    @property
    def pid(self) -> int:
        if self._process is None:
            raise ServiceError("the service is not running")
        return self._process.pid

    def start(self) -> Addresses:
        """Start the child and wait for its ``start`` line; its addresses."""
        command = [sys.executable, "-m", "ratekeeper", "serve", *self.serve_args]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self._process.stdout is not None
        self._reader = threading.Thread(target=self._copy_log, args=(self._process.stdout,), daemon=True)
        self._reader.start()
        if not self._started.wait(START_TIMEOUT) or self._start is None:
            tail = self._log_tail()
            self.stop()
            raise ServiceError(f"the service did not start: {tail or 'no output'} (its log: {self.log_path})")
        http, admin = self._start.get("http"), self._start.get("admin")
        if not http or not admin:
            self.stop()
            raise ServiceError("the tour needs the decision and admin HTTP surfaces; neither may be off")
        return Addresses(http, admin, self._start.get("grpc"))

    def _copy_log(self, stream: IO[bytes]) -> None:
        # Runs until the child closes its output (it ended); sets _started either way, so a
        # child that fails to start is seen at once rather than after the timeout.
        with self.log_path.open("wb") as log:
            for line in stream:
                log.write(line)
                log.flush()
                self._tail.append(line)
                if not self._started.is_set():
                    event = _event(line)
                    if event is not None and event.get("event") == "start":
                        self._start = event if event.get("level") != "error" else None
                        self._started.set()
        self._started.set()

    def _log_tail(self) -> str:
        if self._reader is not None:
            self._reader.join(timeout=5)
        return " / ".join(line.decode(errors="replace").strip() for line in self._tail)

    def wait(self) -> int:
        """Wait until the child ends on its own (its Ctrl-C, or a SIGTERM); its exit status."""
        if self._process is None:
            return 0
        return self._process.wait()

    def stop(self) -> int:
        """Stop the child gracefully (SIGTERM; SIGKILL after ``STOP_TIMEOUT``); its exit status."""
        process, self._process = self._process, None
        if process is None:
            return 0
        process.terminate()
        try:
            return process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()
        finally:
            if self._reader is not None:
                self._reader.join(timeout=5)


def _event(line: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None
