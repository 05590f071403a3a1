"""Hostile clients of a running ``ratekeeper serve``: raw HTTP/1.1 over a socket, a bare
HTTP/2 frame writer and reader (a library such as ``h2`` refuses to break the protocol,
which is the point here), a legitimate client that keeps asking in the background, and
the server's resident memory read from ``/proc``.

Every read is bounded by a socket timeout; a test that waits longer fails, it never hangs.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .clients import OK, descriptor, envoy_request, should_rate_limit
from .conftest import Served

# -- the service's memory -------------------------------------------------------------


def rss_kib(pid: int) -> int:
    """The resident memory of process ``pid`` (``VmRSS`` in ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for process {pid}")


# -- raw HTTP/1.1 -----------------------------------------------------------------------


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


@dataclass
class Received:
    """What a server sent on one connection until it closed it."""

    data: bytes
    reset: bool  # the connection ended with a reset rather than an orderly close

    @property
    def replies(self) -> list[Reply]:
        return parse_replies(self.data)


def read_until_closed(sock: socket.socket, limit: int = 1 << 22) -> Received:
    """Everything the server sends until it closes (a socket timeout fails the test)."""
    data = b""
    while len(data) < limit:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return Received(data, reset=True)
        if not chunk:
            break
        data += chunk
    return Received(data, reset=False)


def exchange(port: int, request: bytes, timeout: float = 10.0) -> Received:
    """Send ``request`` on a new connection and read until the server closes it."""
    with connect(port, timeout) as sock:
        # The server may answer and close before taking it all: then read what it said.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        return read_until_closed(sock)


@dataclass
class Reply:
    """One HTTP/1.1 response."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def problem(self) -> bool:
        return self.headers.get("content-type") == "application/problem+json"


def parse_replies(data: bytes) -> list[Reply]:
    """The responses in ``data``, in order (each framed by its ``content-length``)."""
    replies = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, f"an unfinished response head: {data[:200]!r}"
        lines = head.decode("latin-1").split("\r\n")
        assert lines[0].startswith("HTTP/1.1 "), lines[0]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        assert len(rest) >= length, f"a body cut short: {rest[:200]!r}"
        replies.append(Reply(int(lines[0].split(" ", 2)[1]), headers, rest[:length]))
        data = rest[length:]
    return replies


def read_replies(sock: socket.socket, count: int) -> list[Reply]:
    """Read exactly ``count`` responses from an open connection (it may stay open)."""
    data = b""
    while True:
        try:
            replies = parse_replies(data)
        except AssertionError:
            replies = []  # one is still arriving
        if len(replies) >= count:
            return replies
        chunk = sock.recv(65536)
        assert chunk, f"the server closed after {len(parse_replies(data))} of {count} responses"
        data += chunk


def post(path: str, body: bytes, *, extra: bytes = b"", version: bytes = b"HTTP/1.1") -> bytes:
    """A raw JSON POST with a ``Content-Length`` of ``body`` and ``extra`` header lines."""
    return (
        b"POST %s %s\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
        % (path.encode(), version, len(body), extra)
        + body
    )


# -- a legitimate client, asking all along ----------------------------------------------


def legit_http(served: Served, rule: str) -> None:
    """One ``/healthz`` and one ``/v1/check`` of a fresh key: both must be 200, in time."""
    with httpx.Client(base_url=served.url, timeout=5) as client:
        assert 200 == client.get("/healthz").status_code
        reply = client.post("/v1/check", json={"rule": rule, "key": uuid.uuid4().hex})
        assert 200 == reply.status_code, reply.text


def legit_grpc(served: Served, domain: str, key: str = "user") -> None:
    """One ``ShouldRateLimit`` of a fresh value on a channel of its own: ``OK``, in time."""
    reply = should_rate_limit(served.grpc_target, envoy_request(domain, [descriptor((key, uuid.uuid4().hex))]), 5)
    assert OK == reply.overall_code


@dataclass
class LegitClient:
    """Asks the service every ``interval`` seconds, in a thread, for as long as it runs;
    remembers what went wrong (a status other than 200, an error, an answer slower than
    ``slow`` seconds), so a test can say the service kept serving while it was attacked."""

    served: Served
    rule: str
    interval: float = 0.1
    slow: float = 5.0
    asked: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> LegitClient:
        self._thread = threading.Thread(target=self._run, name="legit-client", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            started = time.monotonic()
            try:
                legit_http(self.served, self.rule)
            except (AssertionError, httpx.HTTPError) as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
            took = time.monotonic() - started
            if took > self.slow:
                self.failures.append(f"a legitimate request took {took:.1f} s")
            self.asked += 1

    def assert_served(self) -> None:
        """Nothing went wrong so far, and the service answers now."""
        assert [] == self.failures, self.failures
        legit_http(self.served, self.rule)


# -- raw HTTP/2 (for the gRPC port) -----------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
REFUSED_STREAM, ENHANCE_YOUR_CALM = 0x7, 0xB


@dataclass(frozen=True)
class Frame:
    type: int
    flags: int
    stream: int
    payload: bytes

    @property
    def error_code(self) -> int:
        """Of a GOAWAY (after the last stream id) or a RST_STREAM."""
        at = 4 if self.type == GOAWAY else 0
        return int.from_bytes(self.payload[at : at + 4], "big")

    @property
    def debug(self) -> bytes:
        """A GOAWAY's debug data."""
        return self.payload[8:]


def frame(type_: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([type_, flags]) + struct.pack(">I", stream) + payload


def _hpack_int(n: int) -> bytes:
    """An HPACK integer with a 7-bit prefix (the string lengths of a literal)."""
    if n < 127:
        return bytes([n])
    out = [127]
    n -= 127
    while n >= 128:
        out.append(n % 128 + 128)
        n //= 128
    out.append(n)
    return bytes(out)


def header_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """``headers`` as HPACK literals without indexing (no table, no Huffman coding)."""
    return b"".join(b"\x00" + _hpack_int(len(k)) + k + _hpack_int(len(v)) + v for k, v in headers)


def grpc_call_headers(method: bytes) -> bytes:
    return header_block(
        [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", method),
            (b":authority", b"127.0.0.1"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
    )


def read_frame(sock: socket.socket) -> Frame | None:
    """The next frame, or None when the server closed the connection."""

    def exactly(n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            try:
                chunk = sock.recv(n - len(data))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            data += chunk
        return data

    head = exactly(9)
    if head is None:
        return None
    payload = exactly(int.from_bytes(head[:3], "big"))
    if payload is None:
        return None
    return Frame(head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload)


def h2_connect(port: int, timeout: float = 10.0) -> socket.socket:
    """A connection that has said the preface and its (empty) settings, and acknowledged
    the server's settings, which a server sends first."""
    sock = connect(port, timeout)
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, ACK, 0))
    return sock


def frames_until(sock: socket.socket, want: int) -> list[Frame]:
    """The frames read until one of type ``want`` arrives or the connection closes."""
    seen = []
    while True:
        f = read_frame(sock)
        if f is None:
            return seen
        seen.append(f)
        if f.type == want:
            return seen


__all__ = [
    "ACK",
    "END_HEADERS",
    "END_STREAM",
    "ENHANCE_YOUR_CALM",
    "GOAWAY",
    "HEADERS",
    "PING",
    "REFUSED_STREAM",
    "RST_STREAM",
    "SETTINGS",
    "Frame",
    "LegitClient",
    "Received",
    "Reply",
    "connect",
    "exchange",
    "frame",
    "frames_until",
    "grpc_call_headers",
    "h2_connect",
    "header_block",
    "legit_grpc",
    "legit_http",
    "parse_replies",
    "post",
    "read_frame",
    "read_replies",
    "read_until_closed",
    "rss_kib",
]
