"""Running wrk and reading what it measured.

wrk prints its summary for humans; a Lua ``done`` hook (``SCRIPT``) prints the same
numbers as one JSON line instead (``RKBENCH {...}``), latency percentiles included, so
nothing is scraped from the human text. No ``request``/``response`` hook is defined, so
wrk stays on its fast C path: statuses are not counted one by one, only wrk's
"non-2xx/3xx" total (``summary.errors.status``), which is the 429s in a run whose limit
is spent (``servers.probe`` checks which statuses a case answers before it is timed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MARKER", "SCRIPT", "WrkError", "WrkResult", "find_wrk", "parse_output", "run_wrk", "wrk_version"]

MARKER = "RKBENCH "

SCRIPT = """\
-- ratekeeper bench web: the summary as one JSON line (latencies in microseconds).
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '%s{"requests": %.0f, "duration_us": %.0f, "bytes": %.0f, "connect": %.0f, "read": %.0f, ' ..
    '"write": %.0f, "status": %.0f, "timeout": %.0f, "p50_us": %.0f, "p90_us": %.0f, ' ..
    '"p99_us": %.0f, "mean_us": %.1f, "max_us": %.0f}\\n',
    "MARKER", summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max))
end
""".replace("MARKER", MARKER)


class WrkError(RuntimeError):
    """wrk is missing, failed, or printed no summary line."""


@dataclass(frozen=True, slots=True)
class WrkResult:
    """One wrk run: counts and wrk's latency distribution (microseconds)."""

    requests: int
    seconds: float
    non_2xx: int
    socket_errors: int
    """Connect, read and write errors and timeouts together."""
    p50_us: float
    p90_us: float
    p99_us: float
    mean_us: float
    max_us: float

    @property
    def rate(self) -> float:
        """Completed requests per second, whatever their status."""
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def non_2xx_fraction(self) -> float:
        return self.non_2xx / self.requests if self.requests else 0.0


def find_wrk() -> str | None:
    """The path of the wrk binary, or None when it is not installed."""
    return shutil.which("wrk")


def wrk_version(wrk: str) -> str:
    """wrk's first line of ``-v`` output, e.g. ``wrk 4.1.0 [epoll] ...``."""
    done = subprocess.run([wrk, "-v"], capture_output=True, text=True, timeout=10, check=False)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[0].split(" Copyright")[0].strip() if lines else "wrk (unknown version)"


def parse_output(stdout: str) -> WrkResult:
    """The ``WrkResult`` in wrk's output, or ``WrkError`` when its summary line is missing."""
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            data = json.loads(line[len(MARKER) :])
            return WrkResult(
                requests=int(data["requests"]),
                seconds=data["duration_us"] / 1e6,
                non_2xx=int(data["status"]),
                socket_errors=int(data["connect"] + data["read"] + data["write"] + data["timeout"]),
                p50_us=float(data["p50_us"]),
                p90_us=float(data["p90_us"]),
                p99_us=float(data["p99_us"]),
                mean_us=float(data["mean_us"]),
                max_us=float(data["max_us"]),
            )
    raise WrkError(f"wrk printed no {MARKER.strip()} line; its output was: {stdout.strip()[-400:]!r}")


def run_wrk(
    wrk: str,
    url: str,
    *,
    seconds: int,
    threads: int,
    connections: int,
    cpu: int | None = None,
) -> WrkResult:
    """Load ``url`` for ``seconds`` (whole seconds: wrk takes no fractions) and return what wrk saw.

    ``cpu`` pins wrk to that CPU with ``taskset`` (None: wherever the kernel puts it).
    """
    with tempfile.TemporaryDirectory(prefix="rk-bench-wrk-") as tmp:
        script = Path(tmp) / "summary.lua"
        script.write_text(SCRIPT, encoding="utf-8")
        command = [wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s", "-s", str(script), url]
        if cpu is not None:
            command = ["taskset", "-c", str(cpu), *command]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 30, check=False)
        except subprocess.TimeoutExpired as exc:
            raise WrkError(f"wrk did not finish within {seconds + 30} s") from exc
    if done.returncode != 0:
        raise WrkError(f"wrk exited with {done.returncode}: {(done.stderr or done.stdout).strip()[-400:]}")
    return parse_output(done.stdout)
