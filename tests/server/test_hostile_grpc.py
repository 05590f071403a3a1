"""The gRPC side of ``ratekeeper serve`` against clients that break the rules, through
the real process: bytes that are no ``RateLimitRequest``, messages over the size cap
(compressed too), too many descriptors, hits at the edge, very long descriptor values,
streams and calls beyond the caps, a ping flood, an idle connection, garbage on the
port, and hostile ``authorization`` metadata. What a client sent never earns ``UNKNOWN``
or ``INTERNAL``, no legitimate client waits past a deadline of a few seconds, and the
server's memory stays within ``RSS_GROWTH_MB``.

The hostile HTTP/2 clients are written frame by frame (``hostile.py``): a library would
refuse to exceed the server's stream cap or to flood it with pings."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from servers import wait_until

from .clients import OK, OVER_LIMIT, descriptor, envoy_request, should_rate_limit
from .conftest import Served, start_server
from .hostile import (
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    GOAWAY,
    HEADERS,
    PING,
    REFUSED_STREAM,
    RST_STREAM,
    connect,
    frame,
    frames_until,
    grpc_call_headers,
    h2_connect,
    legit_grpc,
    read_frame,
    read_until_closed,
    rss_kib,
)

D = f"h{uuid.uuid4().hex[:8]}"
ENVOY = f"""
domain: {D}
descriptors:
  - key: user
    rate_limit: {{unit: minute, requests_per_unit: 5}}
"""
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
MAX_MESSAGE = 8192
MAX_STREAMS = 4
MAX_RPCS = 8
RSS_GROWTH_MB = 16
"""What this module's hostile traffic may add to the service's resident memory
(measured: 0.8 MB); a server that kept what it was sent would grow far more."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = start_server(
        tmp_path_factory.mktemp("hostile-grpc"),
        rules=[ENVOY],
        args=[
            "--grpc-max-message-bytes",
            str(MAX_MESSAGE),
            "--grpc-max-streams",
            str(MAX_STREAMS),
            "--grpc-max-rpcs",
            str(MAX_RPCS),
        ],
    )
    legit_grpc(server, D)  # warm: the baseline memory is that of a serving process
    baseline = rss_kib(server.proc.pid)
    yield server
    grown = rss_kib(server.proc.pid) - baseline
    assert grown < RSS_GROWTH_MB * 1024, f"the service grew by {grown} KiB"
    assert [] == [e for e in server.events() if e.get("level") == "error"]
    assert 0 == server.stop()


def raw_call(target: str, payload: bytes, **kwargs: object) -> bytes:
    """``ShouldRateLimit`` with ``payload`` sent as it is (no serializer)."""
    with grpc.insecure_channel(target) as channel:
        return channel.unary_unary(METHOD)(payload, timeout=5, **kwargs)  # type: ignore[no-any-return]


def refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def own_connection_options() -> list[tuple[str, int]]:
    """A channel that shares no connection with the process's other channels."""
    return [("grpc.use_local_subchannel_pool", 1)]


# -- what one message can hold ------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff\xff\xff\xff",  # no field has number 0 (a tag of 0x...ff7f is out of range)
        b"\x0a\xff\xff\xff\xff\x0f",  # a length of 4 GiB in a message of 6 bytes
        b"\x0a\x05ab",  # a string cut short
        b"\x0a\x01\xff",  # a domain that is not UTF-8
        b"\x12\x05abc",  # a descriptor cut short
        b"\x08",  # a tag without its value
    ],
    ids=["bad-tag", "huge-length", "short-string", "not-utf8", "short-descriptor", "no-value"],
)
def test_bytes_that_are_no_request_are_invalid_argument(served: Served, payload: bytes) -> None:
    error = refused(lambda: raw_call(served.grpc_target, payload))
    assert grpc.StatusCode.INVALID_ARGUMENT == error.code(), error.details()
    assert "RateLimitRequest" in str(error.details())
    legit_grpc(served, D)


def test_a_message_over_the_cap_is_resource_exhausted_even_when_it_is_compressed(served: Served) -> None:
    garbage = raw_call_error(served, b"\xff" * (2 * MAX_MESSAGE))
    assert grpc.StatusCode.RESOURCE_EXHAUSTED == garbage.code()  # measured before it is read
    # 1 MiB of one letter is a few KiB once gzipped: the cap holds for what it inflates to.
    bomb = envoy_request(D, [descriptor(("user", "a" * (1 << 20)))]).SerializeToString()
    assert len(bomb) > 100 * MAX_MESSAGE
    inflated = raw_call_error(served, bomb, compression=grpc.Compression.Gzip)
    assert grpc.StatusCode.RESOURCE_EXHAUSTED == inflated.code()
    legit_grpc(served, D)


def raw_call_error(served: Served, payload: bytes, **kwargs: object) -> grpc.RpcError:
    return refused(lambda: raw_call(served.grpc_target, payload, **kwargs))


def test_descriptors_and_hits_at_their_bounds(served: Served) -> None:
    user = uuid.uuid4().hex
    too_many = envoy_request(D, [descriptor(("user", f"{user}{i}")) for i in range(65)])
    error = refused(lambda: should_rate_limit(served.grpc_target, too_many))
    assert grpc.StatusCode.INVALID_ARGUMENT == error.code()
    assert "65 descriptors" in str(error.details()) and "1 to 64" in str(error.details())
    most = envoy_request(D, [descriptor(("user", f"{user}{i}")) for i in range(64)])
    assert OK == should_rate_limit(served.grpc_target, most).overall_code
    # The request's hits_addend is a uint32: its largest value is a decision (over the
    # limit), not an error, and the refused request charged nothing.
    most_hits = envoy_request(D, [descriptor(("user", user))], hits=2**32 - 1)
    reply = should_rate_limit(served.grpc_target, most_hits)
    assert OVER_LIMIT == reply.overall_code

    def look(value: str) -> int:
        reply = should_rate_limit(served.grpc_target, envoy_request(D, [descriptor(("user", value), hits=0)]))
        return int(reply.statuses[0].limit_remaining)

    assert look(uuid.uuid4().hex) == look(user)  # as for a key never seen
    # A descriptor's hits_addend is a uint64: past 2**32 - 1 it is refused, not wrapped.
    for hits in (2**32, 2**64 - 1):
        over = envoy_request(D, [descriptor(("user", user), hits=hits)])
        error = refused(lambda over=over: should_rate_limit(served.grpc_target, over))  # type: ignore[misc]
        assert grpc.StatusCode.INVALID_ARGUMENT == error.code()
        assert f"adds {hits} hits" in str(error.details())


def test_long_descriptor_values_are_keyed_by_a_digest_of_the_whole_value(served: Served) -> None:
    shared = uuid.uuid4().hex + "v" * 3000  # far over the 512 characters a key may have
    first, second = shared + "a", shared + "b"  # the same first 3,032 characters
    five = envoy_request(D, [descriptor(("user", first))], hits=5)
    assert OK == should_rate_limit(served.grpc_target, five).overall_code
    other = should_rate_limit(served.grpc_target, envoy_request(D, [descriptor(("user", second))]))
    assert OK == other.overall_code  # its own budget: the prefix is not the key
    assert 4 == other.statuses[0].limit_remaining
    again = should_rate_limit(served.grpc_target, envoy_request(D, [descriptor(("user", first))]))
    assert OVER_LIMIT == again.overall_code  # the same long value is the same key
    wide = should_rate_limit(served.grpc_target, envoy_request(D, [descriptor(("user", "é" * 2000))]))
    assert OK == wide.overall_code  # text over the bound in bytes and in characters
    long_key = envoy_request(D, [descriptor(("k" * 3000, "v"), ("user", "u"))])
    assert OK == should_rate_limit(served.grpc_target, long_key).overall_code  # matches no limit


def test_a_flood_of_bad_requests_is_answered_and_leaves_no_trace(served: Served) -> None:
    before = rss_kib(served.proc.pid)
    bad = [b"\xff\xfe" * 100, envoy_request("", [descriptor(("user", "x"))]).SerializeToString()]

    async def flood() -> list[grpc.StatusCode]:
        async with grpc.aio.insecure_channel(served.grpc_target) as channel:
            await channel.channel_ready()
            call = channel.unary_unary(METHOD)

            async def one(payload: bytes) -> grpc.StatusCode:
                try:
                    await call(payload, timeout=10)
                except grpc.aio.AioRpcError as exc:
                    return exc.code()
                return grpc.StatusCode.OK

            codes: list[grpc.StatusCode] = []
            # Waves of half the stream cap: the server may still count a wave's streams
            # when the next one opens (past the cap it refuses streams, a test of its own).
            for _ in range(50):
                codes += await asyncio.gather(*(one(bad[i % 2]) for i in range(MAX_STREAMS // 2)))
            return codes

    codes = asyncio.run(flood())
    assert {grpc.StatusCode.INVALID_ARGUMENT} == set(codes)
    assert rss_kib(served.proc.pid) - before < 16 * 1024
    legit_grpc(served, D)


# -- streams and calls beyond the caps -------------------------------------------------------


def test_a_client_past_the_stream_cap_gets_answers_or_refusals_never_a_hang(served: Served) -> None:
    """grpcio sends more calls than the server's stream cap at once over one connection:
    the streams the server cannot take are refused (REFUSED_STREAM, which grpcio reports
    as UNAVAILABLE, a status a client may retry); none waits past its deadline."""
    request = envoy_request(D, [descriptor(("user", "many"))])

    async def burst() -> list[tuple[grpc.StatusCode, float]]:
        options = own_connection_options()
        async with grpc.aio.insecure_channel(served.grpc_target, options=options) as channel:
            await channel.channel_ready()
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)

            async def one() -> tuple[grpc.StatusCode, float]:
                started = time.monotonic()
                try:
                    await stub.ShouldRateLimit(request, timeout=5)
                except grpc.aio.AioRpcError as exc:
                    return exc.code(), time.monotonic() - started
                return grpc.StatusCode.OK, time.monotonic() - started

            return list(await asyncio.gather(*(one() for _ in range(4 * MAX_STREAMS))))

    outcomes = asyncio.run(burst())
    assert {code for code, _ in outcomes} <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, outcomes
    assert grpc.StatusCode.OK in {code for code, _ in outcomes}
    assert max(took for _, took in outcomes) < 4, outcomes  # none waited for its deadline
    legit_grpc(served, D)


def open_held_calls(port: int, count: int) -> socket.socket:
    """A connection with ``count`` calls whose request message never comes: each holds a
    stream and, once the server took it, a call in progress."""
    sock = h2_connect(port)
    for i in range(count):
        sock.sendall(frame(HEADERS, END_HEADERS, 1 + 2 * i, grpc_call_headers(METHOD.encode())))
    return sock


def collect(socks: list[socket.socket], done: Callable[[list[tuple[int, object]]], bool], timeout: float) -> list:
    """Frames from any of ``socks`` (tagged with the index of theirs) until ``done(frames)``."""
    seen: list[tuple[int, object]] = []
    deadline = time.monotonic() + timeout
    while not done(seen):
        left = deadline - time.monotonic()
        assert left > 0, f"timed out; frames so far: {seen}"
        readable, _, _ = select.select(socks, [], [], left)
        for sock in readable:
            f = read_frame(sock)
            assert f is not None, "the server closed a hostile connection"
            seen.append((socks.index(sock), f))
    return seen


def test_streams_beyond_the_cap_of_a_connection_are_refused_and_others_are_served(served: Served) -> None:
    with open_held_calls(served.grpc_port, MAX_STREAMS + 2) as greedy:
        beyond = {1 + 2 * i for i in range(MAX_STREAMS, MAX_STREAMS + 2)}

        def all_refused(seen: list) -> bool:
            return beyond <= {f.stream for _, f in seen if f.type == RST_STREAM}

        frames = [f for _, f in collect([greedy], all_refused, timeout=5)]
        resets = {f.stream: f.error_code for f in frames if f.type == RST_STREAM}
        assert {s: REFUSED_STREAM for s in beyond} == resets  # only the streams beyond the cap
        started = time.monotonic()
        legit_grpc(served, D)  # another connection: its own streams
        assert time.monotonic() - started < 3
    wait_until(lambda: legit_grpc(served, D) is None, 5, "the service after the greedy connection")


def test_calls_beyond_the_cap_are_resource_exhausted_at_once_and_the_cap_frees_when_they_go(served: Served) -> None:
    connections = 3  # 3 x MAX_STREAMS calls held: more than MAX_RPCS
    held = [open_held_calls(served.grpc_port, MAX_STREAMS) for _ in range(connections)]
    try:
        refused_now = connections * MAX_STREAMS - MAX_RPCS

        def ended(seen: list) -> bool:  # a call refused at once ends with its trailers
            return sum(1 for _, f in seen if f.type == HEADERS and f.flags & END_STREAM) >= refused_now

        collect(held, ended, timeout=5)
        started = time.monotonic()
        with grpc.insecure_channel(served.grpc_target, options=own_connection_options()) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            request = envoy_request(D, [descriptor(("user", uuid.uuid4().hex))])
            error = refused(lambda: stub.ShouldRateLimit(request, timeout=5))
        assert grpc.StatusCode.RESOURCE_EXHAUSTED == error.code(), error.details()
        assert time.monotonic() - started < 3  # told at once, not left waiting
    finally:
        for sock in held:
            sock.close()
    # The calls of a closed connection end: the cap has room again.
    wait_until(lambda: legit_grpc(served, D) is None, 5, "room under --grpc-max-rpcs")


# -- pings, idleness, garbage --------------------------------------------------------------


def test_a_ping_flood_is_answered_with_goaway_enhance_your_calm(served: Served) -> None:
    with h2_connect(served.grpc_port, timeout=5) as flood:
        flood.sendall(b"".join(frame(PING, 0, 0, b"%08d" % i) for i in range(10)))
        frames = frames_until(flood, GOAWAY)
        goaway = frames[-1]
        assert GOAWAY == goaway.type, frames
        assert ENHANCE_YOUR_CALM == goaway.error_code
        assert b"too_many_pings" == goaway.debug
        assert read_frame(flood) is None  # and the connection is closed
    legit_grpc(served, D)


def test_a_channel_with_aggressive_keepalive_is_cut_off_and_others_are_served(served: Served) -> None:
    aggressive = [
        ("grpc.keepalive_time_ms", 10),
        ("grpc.keepalive_timeout_ms", 1000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        *own_connection_options(),
    ]
    was_ready, dropped = threading.Event(), threading.Event()

    def watch(state: grpc.ChannelConnectivity) -> None:
        if state == grpc.ChannelConnectivity.READY:
            was_ready.set()
        elif was_ready.is_set():
            dropped.set()  # the server said GOAWAY: the channel is no longer connected

    with grpc.insecure_channel(served.grpc_target, options=aggressive) as channel:
        channel.subscribe(watch, try_to_connect=True)
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        assert OK == stub.ShouldRateLimit(envoy_request(D, [descriptor(("user", "pinger"))]), timeout=5).overall_code
        legit_grpc(served, D)
        # The client's pings come about once a second; the third one past the policy is the last.
        assert dropped.wait(timeout=10), "the server never cut the pinging connection"
        channel.unsubscribe(watch)
    legit_grpc(served, D)


def test_an_idle_connection_is_closed_after_the_idle_timeout(serve: Callable[..., Served]) -> None:
    served = serve(rules=[ENVOY], args=["--grpc-idle-timeout", "1"])
    with h2_connect(served.grpc_port, timeout=8) as idle:
        started = time.monotonic()
        frames = frames_until(idle, GOAWAY)
        waited = time.monotonic() - started
        assert GOAWAY == frames[-1].type, frames
        assert b"connection idle" == frames[-1].debug
        assert 0.8 <= waited < 6, waited
        assert read_frame(idle) is None
    # A channel that idled past the timeout reconnects on its next call.
    with grpc.insecure_channel(served.grpc_target, options=own_connection_options()) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        request = envoy_request(D, [descriptor(("user", "idler"))])
        assert OK == stub.ShouldRateLimit(request, timeout=5).overall_code
        idle_since = time.monotonic()
        state: list[grpc.ChannelConnectivity] = []
        left = threading.Event()

        def watch(now: grpc.ChannelConnectivity) -> None:
            state.append(now)
            if now != grpc.ChannelConnectivity.READY:
                left.set()

        channel.subscribe(watch)
        assert left.wait(timeout=6), state
        assert time.monotonic() - idle_since >= 0.5
        assert OK == stub.ShouldRateLimit(request, timeout=5).overall_code


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x00" * 64,
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 64,  # the preface, then no frame at all
    ],
    ids=["http1", "zeros", "preface-then-junk"],
)
def test_garbage_on_the_grpc_port_is_closed(served: Served, garbage: bytes) -> None:
    with connect(served.grpc_port, timeout=5) as sock:
        sock.sendall(garbage)
        received = read_until_closed(sock)  # closed (a socket timeout would fail the test)
    assert len(received.data) < 4096
    legit_grpc(served, D)


# -- tokens --------------------------------------------------------------------------------

SECRET = "s3cret-" + "x" * 24


def test_without_the_token_every_call_is_unauthenticated_and_health_stays_open(
    serve: Callable[..., Served],
) -> None:
    served = serve(rules=[ENVOY], env={"RATEKEEPER_DECISION_TOKENS": f"edge:{SECRET}\n"})
    request = envoy_request(D, [descriptor(("user", "u"))])
    hostile = {
        "none": [],
        "basic": [("authorization", f"Basic {SECRET}")],
        "bare": [("authorization", SECRET)],
        "prefix": [("authorization", f"Bearer {SECRET[:-1]}")],
        "longer": [("authorization", f"Bearer {SECRET}x")],
        "empty": [("authorization", "Bearer ")],
        "binary-key": [("authorization-bin", f"Bearer {SECRET}".encode())],
        "wrong-first": [("authorization", "Bearer wrong-secret-wrong-secret"), ("authorization", f"Bearer {SECRET}")],
    }
    with grpc.insecure_channel(served.grpc_target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for name, metadata in hostile.items():
            error = refused(lambda m=metadata: stub.ShouldRateLimit(request, timeout=5, metadata=m))  # type: ignore[misc]
            assert grpc.StatusCode.UNAUTHENTICATED == error.code(), (name, error.details())
        # Without a token, the bytes are not even read: no parse error tells anything.
        error = refused(lambda: channel.unary_unary(METHOD)(b"\xff\xff", timeout=5))
        assert grpc.StatusCode.UNAUTHENTICATED == error.code()
        error = refused(
            lambda: channel.unary_unary("/envoy.service.ratelimit.v3.RateLimitService/Nope")(b"", timeout=5)
        )
        assert grpc.StatusCode.UNAUTHENTICATED == error.code()  # no token: nothing learnt of the methods
        huge = [("authorization", "Bearer " + "x" * 20_000)]  # over the 16 KiB of metadata the server takes
        error = refused(lambda: stub.ShouldRateLimit(request, timeout=5, metadata=huge))
        assert error.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAUTHENTICATED), error.details()
        # Probes carry no token: health stays open, Check and Watch.
        health = health_pb2_grpc.HealthStub(channel)
        assert health_pb2.HealthCheckResponse.SERVING == health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
        watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=5)
        assert health_pb2.HealthCheckResponse.SERVING == next(watch).status
        watch.cancel()
        reply = stub.ShouldRateLimit(request, timeout=5, metadata=[("authorization", f"Bearer {SECRET}")])
        assert OK == reply.overall_code
        lower = stub.ShouldRateLimit(request, timeout=5, metadata=[("authorization", f"bearer {SECRET}")])
        assert OK == lower.overall_code  # the scheme's name is case-insensitive (RFC 9110)
