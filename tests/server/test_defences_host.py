"""RFC 9112 §3.2 through the real ``ratekeeper serve``, with a raw socket (an HTTP client
library always sends one Host): an HTTP/1.1 request without exactly one Host field is
answered 400 problem+json saying so, on the decision and the admin surface, and its
connection is closed; HTTP/1.0 needs no Host."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from .conftest import Served, start_server
from .hostile import Reply, connect, exchange, read_replies


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = start_server(tmp_path_factory.mktemp("host"))
    yield server
    assert 0 == server.stop()


def request(method: bytes, path: bytes, hosts: list[bytes], version: bytes = b"HTTP/1.1", body: bytes = b"") -> bytes:
    head = [b"%s %s %s" % (method, path, version), *(b"Host: " + h for h in hosts)]
    if body:
        head += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    head.append(b"Connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def only_reply(port: int, raw: bytes) -> Reply:
    received = exchange(port, raw)
    [reply] = received.replies
    return reply


def surfaces(served: Served) -> list[tuple[int, bytes, bytes, bytes]]:
    """A request of each surface: (port, method, path, body)."""
    assert served.admin_port is not None
    return [
        (served.http_port, b"POST", b"/v1/check", b'{"rule": "items.list", "key": "%s"}' % uuid.uuid4().hex.encode()),
        (served.http_port, b"GET", b"/healthz", b""),
        (served.admin_port, b"GET", b"/metrics", b""),
    ]


@pytest.mark.parametrize(
    ("version", "hosts", "says"),
    [
        (b"HTTP/1.1", [], "HTTP/1.1 request without a Host header field"),
        (b"HTTP/1.1", [b"a.example", b"b.example"], "2 Host header fields"),
        (b"HTTP/1.1", [b"a.example", b"a.example"], "2 Host header fields"),  # the same twice is still two
        (b"HTTP/1.0", [b"a.example", b"b.example"], "2 Host header fields"),  # none is fine, two are not
    ],
    ids=["missing", "two", "duplicate", "1.0-two"],
)
def test_a_request_without_exactly_one_host_is_400_on_both_surfaces(
    served: Served, version: bytes, hosts: list[bytes], says: str
) -> None:
    for port, method, path, body in surfaces(served):
        reply = only_reply(port, request(method, path, hosts, version, body))
        assert 400 == reply.status, (path, reply)
        assert reply.problem, reply.headers
        assert "close" == reply.headers.get("connection")
        problem = json.loads(reply.body)
        assert 400 == problem["status"]
        assert says in problem["detail"], problem
        assert "exactly one Host header field" in problem["accepted"]


@pytest.mark.parametrize(
    ("version", "hosts"),
    [
        (b"HTTP/1.0", []),  # HTTP/1.0 needs no Host
        (b"HTTP/1.0", [b"a.example"]),
        (b"HTTP/1.1", [b"a.example"]),
        (b"HTTP/1.1", [b"127.0.0.1:8080"]),
        (b"HTTP/1.1", [b"[::1]:8080"]),
        (b"HTTP/1.1", [b""]),  # a target without an authority: an empty Host (RFC 9112 §3.2)
    ],
    ids=["1.0-none", "1.0-one", "name", "ip-port", "ipv6-port", "empty"],
)
def test_requests_with_a_host_as_the_rfc_asks_are_served(served: Served, version: bytes, hosts: list[bytes]) -> None:
    for port, method, path, body in surfaces(served):
        reply = only_reply(port, request(method, path, hosts, version, body))
        assert 200 == reply.status, (path, version, hosts, reply)


def test_a_request_without_host_after_a_good_one_on_the_same_connection_is_400_and_closes(served: Served) -> None:
    good = request(b"GET", b"/healthz", [b"a.example"]).replace(b"Connection: close\r\n", b"")
    bad = request(b"GET", b"/healthz", [])
    with connect(served.http_port) as sock:
        sock.sendall(good)
        [first] = read_replies(sock, 1)
        sock.sendall(bad)
        [second] = read_replies(sock, 1)
        assert (200, 400) == (first.status, second.status)
        assert b"" == sock.recv(1)  # closed after the 400
