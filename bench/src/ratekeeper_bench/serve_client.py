"""The Python load clients of ``ratekeeper bench serve``, run as their own process.

``python -m ratekeeper_bench.serve_client MODE ...`` loads a running ``ratekeeper serve``
and prints one JSON line (``RKBENCH {...}``) with what it measured, so the benchmark can
pin it to a CPU of its own with ``taskset``. Modes:

- ``grpc-peak``: ``--concurrency`` calls of ``ShouldRateLimit`` always in flight over
  ``--channels`` ``grpc.aio`` channels (closed loop), each call a different descriptor
  value (key) in turn: the most calls per second this client gets answered.
- ``grpc-paced`` and ``http-paced`` (``POST`` checks, or ``GET`` of a path such as
  ``/healthz`` without ``--rule``): an open loop at ``--rate`` calls per second: call
  ``i`` is due at ``start + i / rate`` whatever happened before, and its latency runs from
  the moment it was due to its answer, so a server (or client) that falls behind shows
  in the latency instead of silently slowing the rate (the "coordinated omission" wrk2
  corrects). HTTP goes over ``--connections`` keep-alive connections, one request in
  flight on each; a due request waits for a free connection, and that wait is latency.

Latencies are kept whole (microseconds, one float per call) and sorted once at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["MARKER", "grpc_request", "main", "percentile"]

MARKER = "RKBENCH "
KEYS = 10_000
"""Distinct keys (descriptor values) a client cycles through."""


def percentile(ordered: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ascending ``ordered``; 0 when empty."""
    if not ordered:
        return 0.0
    rank = max(1, -(-len(ordered) * p // 100))  # ceil without float rounding surprises
    return ordered[min(len(ordered), int(rank)) - 1]


def _summary(latencies_us: list[float], seconds: float, **counts: Any) -> dict[str, Any]:
    latencies_us.sort()
    return {
        "requests": len(latencies_us),
        "seconds": seconds,
        "p50_us": percentile(latencies_us, 50),
        "p99_us": percentile(latencies_us, 99),
        "max_us": latencies_us[-1] if latencies_us else 0.0,
        **counts,
    }


def grpc_request(domain: str, key: str, value: str) -> Any:
    """A ``RateLimitRequest`` of one descriptor with one entry ``key=value``."""
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # type: ignore[import-untyped]
    from envoy.service.ratelimit.v3 import rls_pb2  # type: ignore[import-untyped]

    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])])


async def _grpc_peak(args: argparse.Namespace) -> dict[str, Any]:
    import grpc  # type: ignore[import-untyped]
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

    channels = [grpc.aio.insecure_channel(args.target) for _ in range(args.channels)]
    stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in channels]
    requests = [grpc_request(args.domain, args.key, f"k{i}") for i in range(KEYS)]
    over = rls_pb2.RateLimitResponse.OVER_LIMIT
    latencies: list[float] = []
    denied = errors = 0
    for stub in stubs:  # connect every channel before the clock starts
        await stub.ShouldRateLimit(requests[0])
    clock = time.perf_counter
    end = clock() + args.seconds

    async def worker(n: int) -> None:
        nonlocal denied, errors
        stub = stubs[n % len(stubs)]
        i = n
        while True:
            started = clock()
            if started >= end:
                return
            try:
                answer = await stub.ShouldRateLimit(requests[i % KEYS])
            except grpc.aio.AioRpcError:
                errors += 1
            else:
                latencies.append((clock() - started) * 1e6)
                denied += answer.overall_code == over
            i += args.concurrency

    began = clock()
    await asyncio.gather(*(worker(n) for n in range(args.concurrency)))
    seconds = clock() - began
    for c in channels:
        await c.close()
    return _summary(latencies, seconds, denied=denied, errors=errors)


async def _paced(rate: float, seconds: float, call: Any) -> tuple[list[float], float, int]:
    """Start ``call(i, due)`` for each call due in ``seconds`` at ``rate``/s; the latencies
    (µs, from due time to answer) of those that answered, the elapsed time, and the
    errors. Calls due together (the loop woke late) are started together."""
    loop = asyncio.get_running_loop()
    clock = time.perf_counter
    total = int(rate * seconds)
    latencies: list[float] = []
    errors = 0
    pending: set[asyncio.Task[None]] = set()

    async def one(i: int, due: float) -> None:
        nonlocal errors
        try:
            await call(i)
        except Exception:  # noqa: BLE001 - counted; the run goes on
            errors += 1
        else:
            latencies.append((clock() - due) * 1e6)

    start = clock() + 0.01
    for i in range(total):
        due = start + i / rate
        wait = due - clock()
        if wait > 0.0005:
            await asyncio.sleep(wait)
        task = loop.create_task(one(i, due))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.wait(pending)
    return latencies, clock() - start, errors


async def _grpc_paced(args: argparse.Namespace) -> dict[str, Any]:
    import grpc
    from envoy.service.ratelimit.v3 import rls_pb2_grpc

    channels = [grpc.aio.insecure_channel(args.target) for _ in range(args.channels)]
    stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in channels]
    requests = [grpc_request(args.domain, args.key, f"k{i}") for i in range(KEYS)]
    for stub in stubs:
        await stub.ShouldRateLimit(requests[0])

    async def call(i: int) -> None:
        await stubs[i % len(stubs)].ShouldRateLimit(requests[i % KEYS])

    latencies, seconds, errors = await _paced(args.rate, args.seconds, call)
    for c in channels:
        await c.close()
    return _summary(latencies, seconds, errors=errors, rate_asked=args.rate)


class _Connection:
    """One keep-alive HTTP/1.1 connection with one request in flight at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def exchange(self, request: bytes) -> int:
        """Send ``request``, read the whole answer (the server always sends Content-Length); its status."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
                break
        if length:
            await self.reader.readexactly(length)
        return status


def http_request(host: str, port: int, path: str, body: bytes | None) -> bytes:
    """The bytes of one keep-alive ``POST path`` with a JSON ``body`` (``GET path`` without)."""
    if body is None:
        return f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode("ascii")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


async def _http_paced(args: argparse.Namespace) -> dict[str, Any]:
    idle: asyncio.Queue[_Connection] = asyncio.Queue()
    connections = []
    for _ in range(args.connections):
        connection = _Connection(*await asyncio.open_connection(args.host, args.port))
        connections.append(connection)
        idle.put_nowait(connection)
    if args.rule:
        requests = [
            http_request(args.host, args.port, args.path, json.dumps({"rule": args.rule, "key": f"k{i}"}).encode())
            for i in range(KEYS)
        ]
    else:
        requests = [http_request(args.host, args.port, args.path, None)]
    statuses: dict[str, int] = {}

    async def call(i: int) -> None:
        connection = await idle.get()
        try:
            status = await connection.exchange(requests[i % len(requests)])
        except BaseException:
            connection.writer.close()  # a broken connection is not given back
            raise
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        idle.put_nowait(connection)

    latencies, seconds, errors = await _paced(args.rate, args.seconds, call)
    for connection in connections:
        connection.writer.close()
    return _summary(latencies, seconds, errors=errors, rate_asked=args.rate, statuses=statuses)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ratekeeper_bench.serve_client", description=__doc__)
    modes = parser.add_subparsers(dest="mode", required=True)
    for name in ("grpc-peak", "grpc-paced"):
        p = modes.add_parser(name)
        p.add_argument("--target", required=True, help="host:port of the gRPC service")
        p.add_argument("--domain", required=True)
        p.add_argument("--key", required=True, help="the descriptor entry's key; values are k0, k1, ...")
        p.add_argument("--channels", type=int, default=2)
        p.add_argument("--seconds", type=float, required=True)
        if name == "grpc-peak":
            p.add_argument("--concurrency", type=int, default=64)
        else:
            p.add_argument("--rate", type=float, required=True)
    p = modes.add_parser("http-paced")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", default="/v1/check")
    p.add_argument("--rule", default="", help="POST a check of this rule, keys k0, k1, ... (default: GET the path)")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--seconds", type=float, required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    run = {"grpc-peak": _grpc_peak, "grpc-paced": _grpc_paced, "http-paced": _http_paced}[args.mode]
    try:
        import uvloop
    except ModuleNotFoundError:  # pragma: no cover - uvicorn[standard] brings it
        result = asyncio.run(run(args))
    else:
        result = uvloop.run(run(args))
    print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
