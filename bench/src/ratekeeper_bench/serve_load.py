"""The load generators of ``ratekeeper bench serve`` and what each one reports, as one ``Load``.

- wrk for HTTP peaks: a Lua script per case (``wrk_script``), ending with the JSON
  ``done`` hook of ``ratekeeper bench web`` so wrk's own latency percentiles are read
  without scraping its human summary. A case whose body never changes sets ``wrk.method``,
  ``wrk.body`` and ``wrk.headers`` once and stays on wrk's C path; a case that varies its
  keys defines ``request()``, one Lua call per request (far cheaper than the server's
  work per request, and wrk's CPU share is reported to show it).
- h2load for the gRPC peak: gRPC is HTTP/2 POSTs of a length-prefixed protobuf message,
  so h2load sends ``ShouldRateLimit`` from C with many streams in flight; its per-request
  log gives the latencies. h2load sends one body, so one descriptor value (one key).
- ``serve_client`` (Python, grpcio asyncio) for the gRPC peak over varied keys and for
  both paced runs (a fixed rate, latency from each call's due time).

Each runs as a child process, optionally pinned to one CPU with ``taskset``.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ratekeeper_bench.serve_client import KEYS, grpc_request, percentile
from ratekeeper_bench.serve_client import MARKER as CLIENT_MARKER
from ratekeeper_bench.web_apps.wrk import SCRIPT as WRK_DONE_HOOK
from ratekeeper_bench.web_apps.wrk import parse_output

__all__ = [
    "GRPC_PATH",
    "HEALTH_BODY",
    "HEALTH_PATH",
    "Load",
    "LoadError",
    "grpc_body",
    "h2load_version",
    "run_client",
    "run_h2load",
    "run_wrk",
    "wrk_script",
]

GRPC_PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
HEALTH_PATH = "/grpc.health.v1.Health/Check"
HEALTH_BODY = b"\x00\x00\x00\x00\x00"
"""A gRPC message of zero bytes: ``HealthCheckRequest(service="")``, the server's overall health."""


class LoadError(RuntimeError):
    """A load generator is missing, failed, or printed no result."""


@dataclass(frozen=True, slots=True)
class Load:
    """What one load generator saw in one run; latencies in microseconds."""

    requests: int
    seconds: float
    p50_us: float
    p99_us: float
    max_us: float
    refused: int = 0
    """Answers that were not a success: HTTP non-2xx (429s here), gRPC ``OVER_LIMIT``."""
    errors: int = 0
    """Socket errors, timeouts, failed streams or calls."""
    failed: int = 0
    """HTTP answers other than 2xx and 429 (a 503 when the store fails)."""
    warm_up: float = 0.0
    """Seconds the generator loaded the service before ``seconds`` began (h2load's warm-up)."""
    statuses: tuple[tuple[int, int], ...] = ()
    """HTTP status -> answers, where the generator counts them (wrk, the paced HTTP client)."""
    rate_asked: float = 0.0
    """The paced runs' target rate (0 for a peak run)."""

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def _pinned(command: list[str], cpu: int | None) -> list[str]:
    return ["taskset", "-c", str(cpu), *command] if cpu is not None else command


def _run(command: list[str], timeout: float) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LoadError(f"{Path(command[0]).name} did not finish within {timeout:g} s") from exc
    except OSError as exc:
        raise LoadError(f"cannot run {command[0]}: {exc}") from exc
    if done.returncode != 0:
        raise LoadError(f"{' '.join(command[:4])}... exited with {done.returncode}: {done.stderr.strip()[-400:]}")
    return done.stdout


# -- wrk -----------------------------------------------------------------------------------


def _lua(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def wrk_script(kind: str, rule: str = "", batch: int = 100) -> str:
    """The Lua script of one wrk case: ``healthz`` (GET, wrk's path), ``denied`` (one fixed
    check of ``rule``), ``check`` (one check of ``rule`` per request, the key changing each
    time among ``KEYS``) or ``batch`` (``batch`` checks of ``rule`` per request, distinct
    keys)."""
    if kind == "healthz":
        head = ""
    elif kind == "denied":
        body = json.dumps({"rule": rule, "key": "spent"}, separators=(",", ":"))
        head = f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = {_lua(body)}\n'
    elif kind == "check":
        head = f"""\
local n = 0
local headers = {{["Content-Type"] = "application/json"}}
local before = {_lua('{"rule":' + json.dumps(rule) + ',"key":"k')}
request = function()
  n = n + 1
  return wrk.format("POST", "/v1/check", headers, before .. (n % {KEYS}) .. '"}}')
end
"""
    elif kind == "batch":
        head = f"""\
local n = 0
local headers = {{["Content-Type"] = "application/json"}}
local before = {_lua('{"rule":' + json.dumps(rule) + ',"key":"k')}
local parts = {{}}
request = function()
  for j = 1, {batch} do
    n = n + 1
    parts[j] = before .. (n % {KEYS}) .. '"}}'
  end
  return wrk.format("POST", "/v1/check", headers, '{{"checks":[' .. table.concat(parts, ",") .. "]}}")
end
"""
    else:
        raise ValueError(f"unknown wrk case {kind!r}")
    return head + WRK_DONE_HOOK + _STATUS_HOOKS


_STATUS_MARKER = "RKSTATUS "
_STATUS_HOOKS = f"""\
-- Statuses counted one by one (a 429 from a 503 apart), then printed after the summary.
local threads = {{}}
setup = function(thread) table.insert(threads, thread) end
statuses = {{}}
response = function(status, headers, body) statuses[status] = (statuses[status] or 0) + 1 end
local summary_done = done
done = function(summary, latency, requests)
  summary_done(summary, latency, requests)
  local parts = {{}}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do table.insert(parts, string.format('"%d": %d', status, n)) end
  end
  io.write("{_STATUS_MARKER}{{" .. table.concat(parts, ", ") .. "}}\\n")
end
"""


def _statuses(stdout: str) -> dict[int, int]:
    """The statuses counted by ``_STATUS_HOOKS`` (summed over wrk's threads)."""
    counts: dict[int, int] = {}
    for line in stdout.splitlines():
        if line.startswith(_STATUS_MARKER):
            for status, n in json.loads(line[len(_STATUS_MARKER) :]).items():
                counts[int(status)] = counts.get(int(status), 0) + int(n)
    return counts


def run_wrk(url: str, script: str, *, seconds: int, connections: int, cpu: int | None) -> Load:
    """One wrk run of ``script`` against ``url`` (one thread) for whole ``seconds``."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise LoadError("wrk is not installed (Debian: apt-get install wrk)")
    with tempfile.TemporaryDirectory(prefix="rk-bench-serve-") as tmp:
        path = Path(tmp) / "case.lua"
        path.write_text(script, encoding="utf-8")
        command = [wrk, "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s", "-s", str(path), url]
        out = _run(_pinned(command, cpu), seconds + 30)
    try:
        w = parse_output(out)
    except RuntimeError as exc:
        raise LoadError(str(exc)) from exc
    statuses = _statuses(out)
    refused = statuses.get(429, 0)
    failed = sum(n for status, n in statuses.items() if not 200 <= status < 300 and status != 429)
    return Load(
        w.requests,
        w.seconds,
        w.p50_us,
        w.p99_us,
        w.max_us,
        refused=refused,
        errors=w.socket_errors,
        failed=failed,
        statuses=tuple(sorted(statuses.items())),
    )


# -- h2load ----------------------------------------------------------------------------------


def grpc_body(domain: str, key: str, value: str) -> bytes:
    """One gRPC message on the wire: no compression, 4-byte big-endian length, the request."""
    message: bytes = grpc_request(domain, key, value).SerializeToString()
    return b"\x00" + struct.pack(">I", len(message)) + message


def h2load_version() -> str | None:
    """``h2load nghttp2/1.52.0``, or None when h2load is not installed."""
    h2load = shutil.which("h2load")
    if h2load is None:
        return None
    done = subprocess.run([h2load, "--version"], capture_output=True, text=True, timeout=10, check=False)
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "h2load"


_DONE = re.compile(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored")


def run_h2load(
    target: str,
    body: bytes,
    *,
    seconds: int,
    clients: int,
    streams: int,
    warm_up: float,
    cpu: int | None,
    path: str = GRPC_PATH,
) -> Load:
    """The gRPC method at ``path`` (default ``ShouldRateLimit``) with ``body`` over
    ``clients`` HTTP/2 connections with ``streams`` streams in flight on each, for whole
    ``seconds`` after ``warm_up`` seconds. gRPC's status is in the trailers, which h2load
    does not read: the caller probes the answers."""
    h2load = shutil.which("h2load")
    if h2load is None:
        raise LoadError("h2load is not installed (Debian: apt-get install nghttp2-client)")
    with tempfile.TemporaryDirectory(prefix="rk-bench-serve-") as tmp:
        data = Path(tmp) / "request.bin"
        data.write_bytes(body)
        log = Path(tmp) / "requests.log"
        command = [
            h2load, f"-c{clients}", f"-m{streams}", f"-D{seconds}", "-d", str(data),
            "-H", "content-type: application/grpc", "-H", "te: trailers", f"--log-file={log}",
        ]  # fmt: skip
        if warm_up > 0:
            command.append(f"--warm-up-time={warm_up:g}")
        command.append(f"http://{target}{path}")
        out = _run(_pinned(command, cpu), seconds + warm_up + 30)
        latencies = sorted(float(line.split("\t")[2]) for line in log.read_text().splitlines() if line.count("\t") >= 2)
    done = _DONE.search(out)
    if done is None:
        raise LoadError(f"h2load printed no request counts: {out.strip()[-400:]!r}")
    failed, errored = int(done.group(5)), int(done.group(6))
    finished = re.search(r"finished in ([\d.]+)(m?s)", out)
    measured = (float(finished.group(1)) / (1000 if finished.group(2) == "ms" else 1)) if finished else 0.0
    # "finished in" includes the warm-up; the log holds the timed phase only.
    timed = float(seconds) if warm_up > 0 else measured
    return Load(
        requests=len(latencies),
        seconds=timed,
        p50_us=percentile(latencies, 50),
        p99_us=percentile(latencies, 99),
        max_us=latencies[-1] if latencies else 0.0,
        errors=failed + errored,
        warm_up=warm_up,
    )


# -- the Python client -----------------------------------------------------------------------


def run_client(arguments: list[str], *, seconds: float, cpu: int | None) -> Load:
    """One run of ``python -m ratekeeper_bench.serve_client ARGUMENTS``."""
    command = [sys.executable, "-m", "ratekeeper_bench.serve_client", *arguments]
    out = _run(_pinned(command, cpu), seconds + 60)
    for line in out.splitlines():
        if line.startswith(CLIENT_MARKER):
            data = json.loads(line[len(CLIENT_MARKER) :])
            statuses: dict[str, int] = data.get("statuses", {})
            refused = statuses.get("429", 0)
            failed = sum(n for status, n in statuses.items() if not status.startswith("2") and status != "429")
            return Load(
                requests=int(data["requests"]),
                seconds=float(data["seconds"]),
                p50_us=float(data["p50_us"]),
                p99_us=float(data["p99_us"]),
                max_us=float(data["max_us"]),
                refused=refused + int(data.get("denied", 0)),
                errors=int(data["errors"]),
                failed=failed,
                statuses=tuple(sorted((int(status), n) for status, n in statuses.items())),
                rate_asked=float(data.get("rate_asked", 0.0)),
            )
    raise LoadError(f"serve_client printed no {CLIENT_MARKER.strip()} line: {out.strip()[-400:]!r}")
