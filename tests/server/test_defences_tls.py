"""With ``--tls-cert``, a connection whose TLS handshake never ends is bounded as a plain
one is: it counts against ``--max-connections`` from its first byte (as an idle
connection, the first to make room for a newcomer) and is closed after
``--read-timeout``. Against the real ``ratekeeper serve`` with raw sockets that send
nothing, or part of a ClientHello, while honest HTTPS clients (httpx) keep being served.

Before: the event loop did the handshake and the protocol learnt of a connection only
once it was done, so half-open handshakes counted nowhere and were closed after
asyncio's 60 s; enough of them used up the open files and nobody was served."""

from __future__ import annotations

import select
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from servers import wait_until

from .conftest import Served
from .hostile import connect

READ_TIMEOUT = 3.0
MARGIN = 3.0
PARTIAL_CLIENT_HELLO = bytes.fromhex("160301020001") + bytes.fromhex("0001fc0303") + b"\x00" * 10
"""A handshake record announcing 512 bytes of a ClientHello, 16 of them sent."""


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (the ``openssl`` command)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (apt-get install openssl)")
    pem, key = tmp_path / "cert.pem", tmp_path / "cert.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(pem), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return pem, key


def serve_tls(serve: Callable[..., Served], cert: tuple[Path, Path], *args: str, **kwargs: object) -> Served:
    pem, key = cert
    verify = ssl.create_default_context(cafile=str(pem))

    def ready(served: Served) -> bool:
        return 200 == httpx.get(https(served), verify=verify, timeout=1).status_code

    tls = ["--tls-cert", str(pem), "--tls-key", str(key), "--read-timeout", f"{READ_TIMEOUT:g}"]
    return serve(args=[*tls, *args], ready=ready, **kwargs)


def https(served: Served, path: str = "/healthz") -> str:
    return f"https://127.0.0.1:{served.http_port}{path}"


def honest(served: Served, cert: tuple[Path, Path]) -> int:
    """One HTTPS request on a new connection: its status (a failure to connect raises)."""
    verify = ssl.create_default_context(cafile=str(cert[0]))
    return httpx.get(https(served), verify=verify, timeout=5).status_code


@contextmanager
def half_open(port: int, count: int, first_bytes: bytes = b"") -> Iterator[list[socket.socket]]:
    """``count`` connections that send ``first_bytes`` of a handshake, then nothing."""
    with ExitStack() as stack:
        socks = []
        for _ in range(count):
            sock = stack.enter_context(connect(port, timeout=READ_TIMEOUT + MARGIN + 5))
            if first_bytes:
                sock.sendall(first_bytes)
            socks.append(sock)
        yield socks


def closed_by_server(sock: socket.socket, wait: float) -> bool:
    """The server closed ``sock`` within ``wait`` seconds, having sent nothing."""
    readable, _, _ = select.select([sock], [], [], wait)
    if not readable:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("first_bytes", [b"", PARTIAL_CLIENT_HELLO], ids=["silent", "partial-client-hello"])
def test_half_open_handshakes_count_against_the_cap_and_are_closed_after_the_read_timeout(
    serve: Callable[..., Served], cert: tuple[Path, Path], first_bytes: bytes
) -> None:
    cap = 4
    served = serve_tls(serve, cert, "--max-connections", str(cap), admin=False)
    began = time.monotonic()
    with half_open(served.http_port, 2 * cap, first_bytes) as socks:
        # Counted: the first `cap` made room for the next ones, at once, long before the timeout.
        first = [closed_by_server(sock, READ_TIMEOUT / 2) for sock in socks[:cap]]
        assert [True] * cap == first
        assert time.monotonic() - began < READ_TIMEOUT / 2 + 1
        # An honest client takes the place of the oldest half-open one and is served.
        assert 200 == honest(served, cert)
        # The others are closed once the read timeout has passed, not after asyncio's 60 s.
        rest = [closed_by_server(sock, READ_TIMEOUT + MARGIN) for sock in socks[cap:]]
        assert [True] * cap == rest
        waited = time.monotonic() - began
        assert READ_TIMEOUT - 0.5 < waited < READ_TIMEOUT + MARGIN, waited
    assert 200 == honest(served, cert)


def test_half_open_handshakes_beyond_the_open_file_limit_lock_nobody_out(
    serve: Callable[..., Served], cert: tuple[Path, Path]
) -> None:
    # 256 open files leave room for 64 connections per listener; 400 half-open handshakes
    # would take every file (accept fails, every newcomer waits) if they counted nowhere.
    served = serve_tls(serve, cert, open_files=256)
    with half_open(served.http_port, 400):
        started = time.monotonic()
        assert 200 == honest(served, cert)
        assert time.monotonic() - started < 5
    limits = [e for e in served.events() if e.get("event") == "limits"]
    assert limits and limits[0]["max_connections"] == 64  # the cap was fitted under the limit


def test_a_failed_handshake_frees_its_place_and_https_goes_on(
    serve: Callable[..., Served], cert: tuple[Path, Path]
) -> None:
    served = serve_tls(serve, cert, "--max-connections", "2", admin=False)
    for _ in range(5):  # more failures than the cap: each one left nothing counted
        with connect(served.http_port) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # plain HTTP on the TLS port
            assert closed_by_server(sock, 5)
    started = time.monotonic()
    assert 200 == honest(served, cert)
    assert time.monotonic() - started < 2
    # An honest client that keeps its connection: its request is still timed from the end
    # of the handshake, and a second request on it is served.
    verify = ssl.create_default_context(cafile=str(cert[0]))
    with httpx.Client(verify=verify, timeout=5) as client:
        assert [200, 200] == [client.get(https(served)).status_code for _ in range(2)]
    wait_until(lambda: honest(served, cert) == 200, 5, "HTTPS after the failed handshakes")
