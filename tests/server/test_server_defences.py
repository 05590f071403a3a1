"""The defences of ``ratekeeper serve`` against clients that hold its resources, each with
a raw socket against the real process: a request that does not arrive whole in time is
closed (408), an endless header is cut at the cap (431) without the memory growing, idle
connections past the open-file limit do not lock out a legitimate request, a connection
beyond the cap when all are busy gets 503 at once, and gRPC refuses an oversized message.
Every wait is bounded by a socket timeout or a polling deadline."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import grpc
import httpx
import pytest

from servers import wait_until

from .clients import descriptor, envoy_request, should_rate_limit
from .conftest import Served

CHECK = {"rule": "items.list", "key": "alice"}


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def read_until_closed(sock: socket.socket, limit: int = 1 << 16) -> bytes:
    """Everything the server sends until it closes (a socket timeout fails the test)."""
    data = b""
    while len(data) < limit:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:100]
    return int(answer.split(b" ", 2)[1])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def legit_check(served: Served) -> int:
    return httpx.post(f"{served.url}/v1/check", json={**CHECK, "key": str(time.monotonic())}, timeout=5).status_code


def test_a_slowloris_connection_is_closed_after_the_read_timeout_while_others_are_served(
    serve: Callable[..., Served],
) -> None:
    served = serve(args=["--read-timeout", "1"])
    with connect(served.http_port) as slow, connect(served.http_port) as silent:
        started = time.monotonic()
        slow.sendall(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        assert 200 == legit_check(served)  # the half-open request holds nobody else up
        answer = read_until_closed(slow)
        waited = time.monotonic() - started
        assert 408 == status_of(answer)
        assert b"within 1 s" in answer
        assert 0.9 <= waited < 5, waited
        assert b"" == read_until_closed(silent)  # sent nothing: closed without a word


def test_a_body_that_never_arrives_whole_is_closed_after_the_read_timeout(serve: Callable[..., Served]) -> None:
    served = serve(args=["--read-timeout", "1"])
    with connect(served.http_port) as slow:
        slow.sendall(
            b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        assert 408 == status_of(read_until_closed(slow))
    assert 200 == legit_check(served)


def test_the_keep_alive_timeout_closes_an_idle_connection(serve: Callable[..., Served]) -> None:
    served = serve(args=["--keep-alive-timeout", "1"])
    with connect(served.http_port) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        started = time.monotonic()
        answer = read_until_closed(conn)
        assert 200 == status_of(answer)
        assert time.monotonic() - started < 5


def test_an_oversized_header_gets_431(serve: Callable[..., Served]) -> None:
    served = serve(args=["--max-header-bytes", "8192"])
    for header in (b"X-Big: " + b"a" * 10_000 + b"\r\n\r\n", b"X-Big: " + b"a" * 10_000):  # whole, and endless
        with connect(served.http_port) as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + header)
            answer = read_until_closed(conn)
            assert 431 == status_of(answer)
            assert b"at most 8192 bytes" in answer
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(100))  # 100 headers of ~110 bytes
    with connect(served.http_port) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
        assert 431 == status_of(read_until_closed(conn))
    assert 200 == httpx.get(f"{served.url}/healthz", headers={"X-Fine": "a" * 4000}, timeout=5).status_code


def test_endless_header_streams_are_cut_early_and_the_memory_stays_bounded(serve: Callable[..., Served]) -> None:
    served = serve()
    before = rss_kib(served.proc.pid)
    sent: list[int] = []
    chunk = b"a" * (1 << 20)
    give_up = 64 << 20  # far more than the cap; the service must cut it long before

    def stream() -> None:
        total = 0
        with connect(served.http_port) as conn:
            try:
                conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
                while total < give_up:
                    conn.sendall(chunk)
                    total += len(chunk)
            except OSError:
                pass  # the service closed the connection: what is wanted
        sent.append(total)

    threads = [threading.Thread(target=stream) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert 3 == len(sent)
    assert all(total < 16 << 20 for total in sent), sent  # cut after the cap and the socket buffers
    grown = rss_kib(served.proc.pid) - before
    assert grown < 32 * 1024, f"RSS grew by {grown} KiB"
    assert 200 == legit_check(served)


@contextmanager
def idle_connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    with ExitStack() as stack:
        socks = [stack.enter_context(connect(port)) for _ in range(count)]
        yield socks


def test_1100_idle_connections_under_a_1024_file_limit_do_not_lock_out_a_request(
    serve: Callable[..., Served],
) -> None:
    served = serve(open_files=1024)
    with idle_connections(served.http_port, 1100):
        started = time.monotonic()
        assert 200 == legit_check(served)
        assert time.monotonic() - started < 5
    limits = [e for e in served.events() if e.get("event") == "limits"]
    assert limits and limits[0]["open_files"] == 1024  # the cap was fitted under the limit


def test_at_the_cap_an_idle_connection_makes_room_and_busy_ones_get_503_at_once(
    serve: Callable[..., Served],
) -> None:
    served = serve(args=["--max-connections", "3", "--read-timeout", "30"])
    with idle_connections(served.http_port, 3) as idle:
        assert 200 == legit_check(served)  # took the place of the oldest idle connection
        assert b"" == read_until_closed(idle[0])
    waiting = (
        b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 50\r\nExpect: 100-continue\r\n\r\n"
    )
    with idle_connections(served.http_port, 3) as busy:
        for conn in busy:
            conn.sendall(waiting)
            # "100 Continue" comes once the application reads the body: a request in progress
            assert conn.recv(100).startswith(b"HTTP/1.1 100 Continue")
        with connect(served.http_port, timeout=5) as late:
            started = time.monotonic()
            answer = read_until_closed(late)  # answered on connecting, before any request
        assert time.monotonic() - started < 2
        assert 503 == status_of(answer)
        assert b"retry-after: 1" in answer.lower()
        assert b"all busy" in answer
        busy[0].close()
        wait_until(lambda: legit_check(served) == 200, 10, "room again")


def test_grpc_refuses_a_message_over_the_size_cap(serve: Callable[..., Served], uid: str) -> None:
    envoy = f"domain: {uid}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: 5}}\n"
    served = serve(rules=[envoy], args=["--grpc-max-message-bytes", "4096"])
    small = envoy_request(uid, [descriptor(("user", "u"))])
    should_rate_limit(served.grpc_target, small)
    big = envoy_request(uid, [descriptor(("user", "u" * 8000))])
    with pytest.raises(grpc.RpcError) as refused:
        should_rate_limit(served.grpc_target, big)
    assert grpc.StatusCode.RESOURCE_EXHAUSTED == refused.value.code()
