"""A server process a load run starts and loads: spare port, optional CPU pin, log file.

``ServerProcess`` starts one child (``spawn``), optionally pinned to one CPU with
``taskset``, its output in a log file whose tail explains a child that failed to start,
and stops it with SIGTERM (SIGKILL when it does not end in time). The built-in
scenario's app server, and the benchmark harness's servers (``ratekeeper-bench``), are
its subclasses; they add what they run and how they are probed.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
from pathlib import Path
from typing import IO, Self

__all__ = ["HOST", "ProcessError", "ServerProcess", "free_port", "tree_cpu_seconds"]

HOST = "127.0.0.1"


class ProcessError(RuntimeError):
    """A server process did not start, or stopped answering."""


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


class ServerProcess:
    """One child process; ``spawn`` it, ``stop`` it (also on leaving a ``with`` block,
    which calls ``start``: a subclass's own way to spawn)."""

    error: type[ProcessError] = ProcessError
    """What ``pid`` raises when nothing runs (a subclass names its own error)."""
    stop_timeout = 10.0
    """Seconds between SIGTERM and SIGKILL."""

    def __init__(self, log_path: Path, *, cpu: int | None = None) -> None:
        self.log_path = log_path
        self.cpu = cpu
        self._log: IO[bytes] | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise self.error("the process is not running")
        return self._process.pid

    def start(self) -> None:
        raise NotImplementedError

    def spawn(self, command: list[str], env: dict[str, str] | None = None) -> None:
        """Start ``command`` (pinned to ``cpu`` when given), its output to ``log_path``."""
        if self.cpu is not None:
            command = ["taskset", "-c", str(self.cpu), *command]
        self._log = self.log_path.open("wb")
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def exited(self) -> bool:
        """Whether the process is not running (never started, stopped, or ended on its own)."""
        return self._process is None or self._process.poll() is not None

    def log_tail(self, lines: int = 10) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return " / ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.pid)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_timeout)
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
