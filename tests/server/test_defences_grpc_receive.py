"""A gRPC call whose request message never comes does not hold its slot under
``--grpc-max-rpcs`` for longer than ``--grpc-read-timeout``: an attacker that opens calls
(HEADERS) and sends nothing more, or part of the message, while its connection stays
open, locks honest Envoys out for at most that long. Against the real process, with the
attacker written frame by frame (``hostile.py``) and grpcio as the honest client.

Without the deadline these tests fail: the held calls end only when their connection
does, and the honest call is refused ``RESOURCE_EXHAUSTED`` until then."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from servers import wait_until

from .clients import OK, descriptor, envoy_request
from .conftest import Served
from .hostile import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    RST_STREAM,
    frame,
    grpc_call_headers,
    h2_connect,
    read_frame,
)

D = f"r{uuid.uuid4().hex[:8]}"
ENVOY = f"""
domain: {D}
descriptors:
  - key: user
    rate_limit: {{unit: minute, requests_per_unit: 1000}}
"""
RLS = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
HEALTH = "/grpc.health.v1.Health/Check"
MAX_RPCS = 4
HELD = MAX_RPCS + 2
"""More than the cap: grpc counts a call it is waiting for as one in progress, so the
cap may refuse one of MAX_RPCS held calls at once, which would leave an honest call room."""
READ_TIMEOUT = 4.0
"""Long enough that the held calls are seen holding every slot before their deadline, also
when the suite loads both CPUs (two seconds were not, now and then)."""
MARGIN = 3.0
"""Seconds past the deadline within which the honest client must be answered."""
SECRET = "s3cret-" + "r" * 24


def start(serve: Callable[..., Served], read_timeout: float = READ_TIMEOUT, **kwargs: object) -> Served:
    args = ["--grpc-max-rpcs", str(MAX_RPCS), "--grpc-read-timeout", f"{read_timeout:g}"]
    return serve(rules=[ENVOY], args=args, **kwargs)


def ask(served: Served, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.StatusCode:
    """One honest ``ShouldRateLimit`` on a connection of its own: its status (OK once answered)."""
    options = [("grpc.use_local_subchannel_pool", 1)]  # shares no connection with another channel
    with grpc.insecure_channel(served.grpc_target, options=options) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        try:
            reply = stub.ShouldRateLimit(
                envoy_request(D, [descriptor(("user", uuid.uuid4().hex))]), timeout=5, metadata=metadata
            )
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    assert OK == reply.overall_code
    return grpc.StatusCode.OK


@contextmanager
def held_calls(served: Served, method: str, first_bytes: bytes = b"") -> Iterator[list[socket.socket]]:
    """``HELD`` calls of ``method``, one a connection, that send HEADERS and then
    ``first_bytes`` of their message only (wrapped in a DATA frame without END_STREAM)."""
    with ExitStack() as stack:
        socks = []
        for _ in range(HELD):
            sock = stack.enter_context(h2_connect(served.grpc_port, timeout=READ_TIMEOUT + MARGIN + 5))
            sock.sendall(frame(HEADERS, END_HEADERS, 1, grpc_call_headers(method.encode())))
            if first_bytes:
                sock.sendall(frame(DATA, 0, 1, first_bytes))
            socks.append(sock)
        yield socks


def call_ended(sock: socket.socket) -> bool:
    """Read frames until the server ends stream 1 (trailers, or a reset); False when it
    closed the connection instead (the deadline ends the call, not the connection)."""
    while True:
        f = read_frame(sock)
        if f is None:
            return False
        if f.stream == 1 and (f.type == RST_STREAM or (f.type == HEADERS and f.flags & END_STREAM)):
            return True


def assert_slots_come_back(served: Served, socks: list[socket.socket], began: float) -> None:
    """Every slot is held now (refused at once), the honest call is answered by the
    deadline plus ``MARGIN``, and each held call was ended by the server."""
    # The attack works: once the server has taken the held calls, every slot is theirs
    # (an honest call asked before that may still get through).
    held_by = began + READ_TIMEOUT * 0.75  # after that the deadline may free them any moment
    wait_until(lambda: ask(served) == grpc.StatusCode.RESOURCE_EXHAUSTED, held_by - time.monotonic(), "the slots held")
    refused_at = time.monotonic()
    assert grpc.StatusCode.RESOURCE_EXHAUSTED == ask(served)
    assert time.monotonic() - refused_at < 1  # refused at once, not queued
    while (code := ask(served)) != grpc.StatusCode.OK:
        assert grpc.StatusCode.RESOURCE_EXHAUSTED == code
        assert time.monotonic() - began < READ_TIMEOUT + MARGIN, "the held calls still hold every slot"
    waited = time.monotonic() - began
    assert waited < READ_TIMEOUT + MARGIN, waited
    assert [True] * len(socks) == [call_ended(sock) for sock in socks]


@pytest.mark.parametrize(
    "first_bytes",
    [b"", b"\x00\x00\x00\x00\x64" + b"\x0a\x03abc"],  # nothing; 8 of the 100 bytes announced
    ids=["headers-only", "part-of-the-message"],
)
def test_calls_whose_message_never_comes_free_their_slot_after_the_read_timeout(
    serve: Callable[..., Served], first_bytes: bytes
) -> None:
    served = start(serve)
    assert grpc.StatusCode.OK == ask(served)
    began = time.monotonic()
    with held_calls(served, RLS, first_bytes) as socks:
        assert_slots_come_back(served, socks, began)
        assert grpc.StatusCode.OK == ask(served)  # the attacker's connections are still open: no matter


def test_held_health_checks_free_their_slot_too(serve: Callable[..., Served]) -> None:
    served = start(serve)
    began = time.monotonic()
    with held_calls(served, HEALTH) as socks:
        assert_slots_come_back(served, socks, began)
    # A whole health check is answered as before.
    with grpc.insecure_channel(served.grpc_target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health_pb2.HealthCheckResponse.SERVING == reply.status


def test_a_call_without_a_token_is_refused_at_once_and_holds_no_slot(serve: Callable[..., Served]) -> None:
    # A deadline far beyond the test: only the refusal can free the slots in time.
    served = start(serve, read_timeout=60, env={"RATEKEEPER_DECISION_TOKENS": f"edge:{SECRET}\n"})
    token = (("authorization", f"Bearer {SECRET}"),)
    with held_calls(served, RLS) as socks:
        assert [True] * len(socks) == [call_ended(sock) for sock in socks]  # refused without the message
        started = time.monotonic()
        assert grpc.StatusCode.OK == ask(served, token)
        assert time.monotonic() - started < 2


def test_a_whole_message_sent_slowly_within_the_deadline_is_answered(serve: Callable[..., Served]) -> None:
    served = start(serve, read_timeout=30)
    message = envoy_request(D, [descriptor(("user", "slow"))]).SerializeToString()
    framed = b"\x00" + len(message).to_bytes(4, "big") + message
    with h2_connect(served.grpc_port) as sock:
        sock.sendall(frame(HEADERS, END_HEADERS, 1, grpc_call_headers(RLS.encode())))
        sock.sendall(frame(DATA, 0, 1, framed[:3]))
        sock.sendall(frame(DATA, END_STREAM, 1, framed[3:]))
        frames = []
        while not (frames and frames[-1].type == HEADERS and frames[-1].flags & END_STREAM):
            f = read_frame(sock)
            assert f is not None, frames
            if f.stream == 1:
                frames.append(f)
    answers = [f for f in frames if f.type == DATA]
    assert answers, frames  # a response message, not only trailers
