"""The HTTP listeners of ``ratekeeper serve`` against raw bytes no well-behaved client
sends, through the real process: broken request lines and methods, a 100 KB URL,
request smuggling (Content-Length with Transfer-Encoding, two Content-Lengths), bad
chunk sizes, a chunked body over the 64 KiB cap, 100 pipelined requests, HTTP/1.0
without Host, an Upgrade request, bytes that are not UTF-8 in headers and bodies, and
JSON built to hurt a parser (100,000 levels deep, 100,000 digits, duplicate keys).

Each gets a 4xx problem or a clean close, never a 5xx and never a wait past the read
timeout; a smuggled request is never answered nor charged. A legitimate client asks
``/healthz`` and ``/v1/check`` all along (``LegitClient``), and the server's memory stays
within ``RSS_GROWTH_MB``."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from ratekeeper.server.inputs import MAX_BODY

from .conftest import Served, start_server
from .hostile import LegitClient, Received, connect, exchange, post, read_replies, read_until_closed, rss_kib

U = f"h{uuid.uuid4().hex[:8]}"
RULE = f"{U}.api"
NATIVE = f"""
rules:
  - name: {RULE}
    limits: ["1000/minute"]
"""
D = f"{U}-envoy"
ENVOY = f"""
domain: {D}
descriptors:
  - key: user
    rate_limit: {{unit: minute, requests_per_unit: 1000}}
"""
ADMIN_SECRET = "ops-secret-" + "y" * 24
READ_TIMEOUT = 3
RSS_GROWTH_MB = 16
"""What this module's hostile traffic may add to the service's resident memory
(measured: 0.8 MB); a server that buffered the bodies it refuses would grow more."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = start_server(
        tmp_path_factory.mktemp("hostile-http"),
        rules=[NATIVE, ENVOY],
        args=["--read-timeout", str(READ_TIMEOUT)],
        env={"RATEKEEPER_ADMIN_TOKENS": f"ops:{ADMIN_SECRET}\n"},
    )
    httpx.post(f"{server.url}/v1/check", json={"rule": RULE, "key": "warm"}, timeout=5)
    baseline = rss_kib(server.proc.pid)
    yield server
    grown = rss_kib(server.proc.pid) - baseline
    assert grown < RSS_GROWTH_MB * 1024, f"the service grew by {grown} KiB"
    assert [] == [e for e in server.events() if e.get("level") == "error"]
    assert 0 == server.stop()


@pytest.fixture(scope="module")
def legit(served: Served) -> Iterator[LegitClient]:
    client = LegitClient(served, RULE).start()
    yield client
    client.stop()


@pytest.fixture(autouse=True)
def still_served(legit: LegitClient) -> Iterator[None]:
    """After each test: the legitimate client was served all along, and is served now."""
    yield
    legit.assert_served()


def remaining(served: Served, key: str) -> int:
    reply = httpx.post(f"{served.url}/v1/peek", json={"rule": RULE, "key": key, "cost": 0}, timeout=5)
    assert 200 == reply.status_code, reply.text
    return int(reply.json()["remaining"])


def one_answer_then_closed(received: Received, *statuses: int) -> None:
    """Exactly one response, with one of ``statuses``, and the connection closed."""
    replies = received.replies
    assert 1 == len(replies), received.data[:500]
    assert replies[0].status in statuses, replies[0]
    assert "close" == replies[0].headers.get("connection"), replies[0].headers


# -- the request line and the head ----------------------------------------------------------

BROKEN = [
    ("garbage", b"\x00\x01\x02garbage\r\n\r\n"),
    ("no-target", b"GET\r\n\r\n"),
    ("unknown-method", b"FOO /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("connect", b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n"),
    ("http-9.9", b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n"),
    ("bare-lf", b"GET /healthz HTTP/1.1\nHost: x\n\n"),
    ("folded-header", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n"),
    ("nul-in-header", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n"),
    ("space-in-name", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX A: b\r\n\r\n"),
    ("not-utf8-path", b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("h2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
    ("negative-length", post("/v1/check", b"{}").replace(b"Content-Length: 2", b"Content-Length: -1")),
    ("signed-length", post("/v1/check", b"{}").replace(b"Content-Length: 2", b"Content-Length: +2")),
    ("overflowing-length", post("/v1/check", b"{}").replace(b"Content-Length: 2", b"Content-Length: " + b"9" * 30)),
]


@pytest.mark.parametrize("request_", [b for _, b in BROKEN], ids=[n for n, _ in BROKEN])
def test_a_request_the_parser_refuses_gets_400_and_a_close(served: Served, request_: bytes) -> None:
    one_answer_then_closed(exchange(served.http_port, request_), 400)


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (b"PROPFIND /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"DELETE /v1/check HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"GET /%ff%00%2e%2e/healthz HTTP/1.1\r\nHost: x\r\n\r\n", 404),
    ],
    ids=["propfind", "delete", "options-star", "escaped-junk-path"],
)
def test_a_method_or_target_no_route_answers_is_a_4xx_problem(served: Served, request_: bytes, status: int) -> None:
    with connect(served.http_port) as sock:
        sock.sendall(request_)
        (reply,) = read_replies(sock, 1)
    assert status == reply.status
    assert reply.problem
    assert status == json.loads(reply.body)["status"]  # the path's junk is escaped, the JSON whole


def test_a_100_kb_url_gets_431(served: Served) -> None:
    received = exchange(served.http_port, b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    one_answer_then_closed(received, 431)
    assert b"request line and headers" in received.replies[0].body


def test_http_1_0_without_host_is_answered_and_closed(served: Served) -> None:
    health = exchange(served.http_port, b"GET /healthz HTTP/1.0\r\n\r\n")
    body = json.dumps({"rule": RULE, "key": uuid.uuid4().hex}).encode()
    check = exchange(served.http_port, post("/v1/check", body, version=b"HTTP/1.0").replace(b"Host: x\r\n", b""))
    for received in (health, check):
        one_answer_then_closed(received, 200)  # HTTP/1.0 needs no Host, and keeps no connection


@pytest.mark.parametrize("protocol", [b"websocket", b"h2c"])
def test_an_upgrade_request_is_answered_as_plain_http_at_once(served: Served, protocol: bytes) -> None:
    upgrade = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: %s\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n" % protocol
    )
    started = time.monotonic()
    received = exchange(served.http_port, upgrade, timeout=READ_TIMEOUT + 5)
    assert time.monotonic() - started < 2  # not left waiting for an upgrade that never comes
    assert [200] == [r.status for r in received.replies]


# -- smuggling and chunks ---------------------------------------------------------------------


def smuggled_check(key: str) -> bytes:
    body = json.dumps({"rule": RULE, "key": key, "cost": 7}).encode()
    return post("/v1/check", body)


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
        b"Content-Length: 0\r\nContent-Length: 2\r\n\r\n{}",
        b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
        b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
        b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    ],
    ids=["cl-then-te", "te-then-cl", "two-lengths", "two-equal-lengths", "te-unknown", "te-space-before-colon"],
)
def test_a_smuggling_attempt_gets_400_and_the_smuggled_request_is_never_run(served: Served, framing: bytes) -> None:
    key = uuid.uuid4().hex
    head = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    received = exchange(served.http_port, head + framing + smuggled_check(key))
    one_answer_then_closed(received, 400)
    assert 1000 == remaining(served, key)  # the request hidden behind the ambiguous framing did nothing


@pytest.mark.parametrize(
    "chunks",
    [b"zz\r\n{}\r\n0\r\n\r\n", b"-1\r\n{}\r\n0\r\n\r\n", b"f" * 20 + b"\r\n{}\r\n0\r\n\r\n", b"1\r\n{}\r\n0\r\n\r\n"],
    ids=["not-hex", "negative", "over-64-bits", "data-longer-than-its-size"],
)
def test_a_bad_chunk_size_gets_400_and_a_close(served: Served, chunks: bytes) -> None:
    head = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    one_answer_then_closed(exchange(served.http_port, head + chunks), 400)


def test_a_chunked_body_over_the_cap_is_413_and_the_rest_of_it_is_never_read_as_a_request(served: Served) -> None:
    key = uuid.uuid4().hex
    lure = smuggled_check(key)  # request-looking bytes inside the body: data, never a request
    chunk = (lure * (1024 // len(lure) + 1))[:1024]
    body = b"".join(b"400\r\n" + chunk + b"\r\n" for _ in range(MAX_BODY // 1024 + 16)) + b"0\r\n\r\n"
    head = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    after = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    received = exchange(served.http_port, head + body + after)
    assert [413, 200] == [r.status for r in received.replies]  # the body's end is found, the next request served
    assert 1000 == remaining(served, key)


def test_a_declared_body_over_the_cap_is_413_at_once_and_the_only_answer(served: Served) -> None:
    head = post("/v1/check", b"").replace(b"Content-Length: 0", b"Content-Length: 1000000000")
    with connect(served.http_port, timeout=READ_TIMEOUT + 5) as sock:
        started = time.monotonic()
        sock.sendall(head + b'{"rule": ')
        (reply,) = read_replies(sock, 1)
        assert 413 == reply.status
        assert time.monotonic() - started < 2  # on the Content-Length, before any body
        # The body never comes: the connection is closed at the read timeout, with no
        # second answer to a request that already has one.
        assert b"" == read_until_closed(sock).data
        assert time.monotonic() - started < READ_TIMEOUT + 3


def test_100_pipelined_requests_are_answered_in_order(served: Served) -> None:
    key = uuid.uuid4().hex
    requests, expected = [], []
    for i in range(100):
        if i % 10 == 3:
            requests.append(post("/v1/peek", b'{"rule": '))  # malformed: a 400 that keeps the connection
            expected.append((400, None))
        elif i % 2:
            requests.append(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            expected.append((200, None))
        else:
            requests.append(post("/v1/peek", json.dumps({"rule": RULE, "key": key, "cost": i}).encode()))
            expected.append((200, 1000 - i))  # what a peek of cost i leaves: says which answer it is
    requests[-1] = requests[-1].replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")
    received = exchange(served.http_port, b"".join(requests))
    replies = received.replies
    assert 100 == len(replies)
    got = [(r.status, json.loads(r.body).get("remaining") if r.status == 200 else None) for r in replies]
    assert expected == got


# -- bytes that are not UTF-8 ---------------------------------------------------------------


def test_bytes_that_are_not_utf8_in_headers_are_refused_or_ignored_never_a_5xx(served: Served) -> None:
    odd = b"GET /healthz HTTP/1.1\r\nHost: \xff\xfe\r\nX-Name: \xc3\x28\xff\r\nConnection: close\r\n\r\n"
    one_answer_then_closed(exchange(served.http_port, odd), 200)  # headers no route reads
    body = json.dumps({"rule": RULE, "key": "k"}).encode()
    media = post("/v1/check", body, extra=b"Connection: close\r\n").replace(
        b"application/json", b"application/json\xff"
    )
    received = exchange(served.http_port, media)
    one_answer_then_closed(received, 415)
    assert received.replies[0].problem
    admin = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\x80\r\nConnection: close\r\n\r\n"
    received = exchange(port_of(served, "/metrics"), admin)
    one_answer_then_closed(received, 401)
    assert "Bearer" == received.replies[0].headers.get("www-authenticate")


# -- JSON built to hurt ----------------------------------------------------------------------


def body_for(path: str, value: bytes) -> bytes:
    """A body for ``path`` with ``value`` where a number goes."""
    if path == "/json":
        return b'{"domain": "%s", "descriptors": [{"entries": [{"key": "user", "value": "v"}]}], "hitsAddend": %s}' % (
            D.encode(),
            value,
        )
    if path == "/v1/reset":
        return b'{"rule": "%s", "key": %s}' % (RULE.encode(), value)
    return b'{"rule": "%s", "key": "k", "cost": %s}' % (RULE.encode(), value)


ROUTES = ["/v1/check", "/v1/peek", "/json", "/v1/reset"]
ADMIN_PATHS = ("/v1/reset", "/metrics")


def port_of(served: Served, path: str) -> int:
    """The port of the surface that serves ``path``."""
    if path in ADMIN_PATHS:
        assert served.admin_port is not None
        return served.admin_port
    return served.http_port


def auth_of(path: str) -> bytes:
    """The header line the admin surface needs (it has a token)."""
    return b"Authorization: Bearer %s\r\n" % ADMIN_SECRET.encode() if path in ADMIN_PATHS else b""


HURTFUL = [
    ("nested-100000", b"[" * 100_000 + b"]" * 100_000, 413),  # 200 KB: refused by its size
    ("nested-30000", b"[" * 30_000 + b"]" * 30_000, 400),  # 60 KB, under the cap: refused by its depth
    ("open-30000", b"[" * 30_000, 400),
    ("digits-100000", b"9" * 100_000, 413),
    ("digits-60000", b"9" * 60_000, 400),
    ("digits-4000", b"9" * 4000, 400),
    ("exponent", b"1e999999", 400),
    ("fraction-digits", b"0." + b"1" * 60_000, 400),
    ("nan", b"NaN", 400),
    ("not-utf8", b'"\xff\xfe"', 400),
    ("lone-surrogate", b'"\\udc80"', 400),
]


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize(("value", "status"), [h[1:] for h in HURTFUL], ids=[h[0] for h in HURTFUL])
def test_json_built_to_hurt_the_parser_gets_a_4xx_problem(served: Served, path: str, value: bytes, status: int) -> None:
    body = body_for(path, value)
    with connect(port_of(served, path)) as sock:
        sock.sendall(post(path, body, extra=auth_of(path)))
        (reply,) = read_replies(sock, 1)  # the connection stays open: no reset cuts the answer short
    assert status == reply.status, reply.body[:300]
    assert reply.problem
    problem = json.loads(reply.body)
    assert problem["detail"] and problem["accepted"]
    assert len(reply.body) < min(len(body), MAX_BODY) + 1024  # no amplification: at most an echo


@pytest.mark.parametrize("path", ROUTES)
def test_duplicate_json_keys_are_refused(served: Served, path: str) -> None:
    """Two parsers may keep different copies of a duplicated key (the first, or the last):
    a proxy that checks one and a service that acts on the other disagree on what was
    asked. RFC 8259 leaves the meaning open; the service refuses the ambiguity."""
    key = uuid.uuid4().hex
    if path == "/json":
        body = b'{"domain": "elsewhere", "domain": "%s", "descriptors": [{"entries": [{"key": "user", "value": "v"}]}]}'
        body %= D.encode()
    else:
        body = b'{"rule": "%s", "key": "%s", "key": "%s-other"}' % (RULE.encode(), key.encode(), key.encode())
    with connect(port_of(served, path)) as sock:
        sock.sendall(post(path, body, extra=auth_of(path)))
        (reply,) = read_replies(sock, 1)
    assert 400 == reply.status, reply.body[:300]
    assert reply.problem
    assert b"duplicate" in reply.body.lower() or b"twice" in reply.body.lower()
    assert 1000 == remaining(served, key) and 1000 == remaining(served, f"{key}-other")
