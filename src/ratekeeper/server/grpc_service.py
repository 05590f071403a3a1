"""The gRPC side: Envoy's ``RateLimitService`` and gRPC health checking, on ``grpc.aio``.

``ShouldRateLimit`` answers as ``envoy.should_rate_limit`` decides. A bad request, and
bytes that are no ``RateLimitRequest``, are ``INVALID_ARGUMENT`` with the reason and
what is accepted; a store that fails under the ``raise`` policy is
``UNAVAILABLE`` (Envoy then applies its ``failure_mode_deny``). Health checking
(``grpc.health.v1.Health``) reports ``SERVING`` while the store answers and
``NOT_SERVING`` when it does not, for the overall server ("") and for the rate-limit
service by name; ``Health`` watchers are told of each change.

With decision tokens, ``ShouldRateLimit`` needs the metadata ``authorization: Bearer
<secret>`` (``UNAUTHENTICATED`` without it); health checking answers without one, as
``/healthz`` does. The server is bounded (``GrpcLimits``): message size, streams per
connection, RPCs in progress, keep-alive pings, idle connections, the connection
handshake, and the time a call's request message has to arrive (``ReceiveDeadline``).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc  # type: ignore[import-untyped]
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from ratekeeper.errors import InvalidRequest, StoreError
from ratekeeper.server.auth import TokenSource, bearer_secret
from ratekeeper.server.envoy import should_rate_limit
from ratekeeper.server.problems import BadInput
from ratekeeper.server.service import Service
from ratekeeper.server.tls import TlsState

__all__ = [
    "SERVICE_NAME",
    "GrpcLimits",
    "RateLimitServicer",
    "ReceiveDeadline",
    "TokenInterceptor",
    "build_grpc_server",
]

SERVICE_NAME = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"].full_name
"""``envoy.service.ratelimit.v3.RateLimitService``: the name health checking answers for."""


@dataclass(frozen=True, slots=True)
class Malformed:
    """Bytes that are no ``RateLimitRequest``, and why."""

    reason: str


def _request_or_malformed(data: bytes) -> Any:
    """The request in ``data``, else ``Malformed``: a deserializer that raises makes grpc
    answer ``UNKNOWN``, which blames the server for what the client sent."""
    try:
        return rls_pb2.RateLimitRequest.FromString(data)
    except DecodeError as exc:
        return Malformed(str(exc))


class RateLimitServicer(rls_pb2_grpc.RateLimitServiceServicer):  # type: ignore[misc]
    """``ShouldRateLimit`` over the service's limiter and Envoy-form rules."""

    def __init__(self, service: Service) -> None:
        self.service = service
        # The labelled counter resolved once: ``labels()`` costs a lock and a lookup a call.
        self._count_request = service.metrics.requests.labels("grpc").inc

    async def ShouldRateLimit(self, request: Any, context: Any) -> Any:
        self._count_request()
        try:
            if isinstance(request, Malformed):
                raise BadInput(400, f"not a RateLimitRequest: {request.reason}", "a serialized RateLimitRequest")
            return await should_rate_limit(self.service, request)
        except BadInput as exc:
            accepted = f"; expected {exc.accepted}" if exc.accepted else ""
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{exc.detail}{accepted}")
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except StoreError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the store failed: {type(exc).__name__}: {exc}")
        raise AssertionError("unreachable: abort raises")


class Health:
    """The health servicer and the status it reports."""

    def __init__(self) -> None:
        self.servicer = health.aio.HealthServicer()

    async def set(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self.servicer.set(name, status)

    async def shutting_down(self) -> None:
        await self.servicer.enter_graceful_shutdown()


_OPEN_PREFIX = "/grpc.health.v1.Health/"
"""Methods answered without a token (probes carry none)."""


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses an RPC without a known bearer token in its ``authorization`` metadata."""

    def __init__(self, tokens: TokenSource) -> None:
        self.tokens = tokens

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        tokens = self.tokens.tokens
        if not tokens or details.method.startswith(_OPEN_PREFIX):
            return await continuation(details)
        authorization = next((v for k, v in details.invocation_metadata or () if k == "authorization"), None)
        if isinstance(authorization, bytes):
            authorization = authorization.decode("latin-1")
        if tokens.match(bearer_secret(authorization)) is not None:
            return await continuation(details)
        what = "no bearer token" if authorization is None else "a token the decision surface does not know"
        # Request-streaming: the refusal is sent at once, without waiting for the message.
        return grpc.stream_unary_rpc_method_handler(_refuse(f"{details.method} needs a token; the call has {what}"))


def _refuse(message: str) -> Callable[[Any, Any], Awaitable[Any]]:
    async def handler(requests: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED, f"{message}; expected metadata authorization: Bearer <secret>"
        )

    return handler


class ReceiveDeadline(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Cancels a call whose request message has not arrived whole within ``seconds``.

    grpc counts a call against ``maximum_concurrent_rpcs`` from its HEADERS frame until
    its handler returns, and a unary handler only starts once the message is whole: a
    client that sends HEADERS and then nothing (or part of the message), while it answers
    the keep-alive pings, would hold its slot forever, and ``max_rpcs`` such calls lock
    out every Envoy. grpc has no server-side receive deadline (the call's deadline is the
    client's ``grpc-timeout``, which an attacker leaves out), so each request-unary
    handler is served as a request-streaming one that reads its one message under a
    timer: past it the call ends ``DEADLINE_EXCEEDED`` and its slot is free.
    """

    _MAX_WRAPPED = 64
    """Handlers kept wrapped: the service's methods are a few; past this, wrapped per call."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        # Each method's handler wrapped once, not on every call: by the handler's identity
        # (the servicer's handlers live as long as the server), the handler kept alongside.
        self._wrapped: dict[int, tuple[Any, Any]] = {}

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_streaming:
            return handler  # unknown methods are refused at once; streams read as they go
        found = self._wrapped.get(id(handler))
        if found is not None and found[0] is handler:
            return found[1]
        wrapped = _reading_under_deadline(handler, self.seconds)
        if len(self._wrapped) < self._MAX_WRAPPED:
            self._wrapped[id(handler)] = (handler, wrapped)
        return wrapped


def _reading_under_deadline(handler: Any, seconds: float) -> Any:
    """``handler`` (request-unary) as a request-streaming handler that waits at most
    ``seconds`` for its message; a synchronous behaviour (none here) is left as it is."""

    async def receive(context: Any) -> Any:
        try:
            async with asyncio.timeout(seconds):  # no task of its own, unlike wait_for
                request = await context.read()
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request message did not arrive whole within {seconds:g} s of the call's start; "
                f"expected the whole message within {seconds:g} s",
            )
        if request is grpc.aio.EOF:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the call ended without its request message; expected one message"
            )
        return request

    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if not handler.response_streaming:
        unary = handler.unary_unary
        if not inspect.iscoroutinefunction(unary):
            return handler

        async def answer(requests: Any, context: Any) -> Any:
            return await unary(await receive(context), context)

        return grpc.stream_unary_rpc_method_handler(answer, **serializers)
    streaming = handler.unary_stream
    if inspect.iscoroutinefunction(streaming):  # writes with context.write

        async def write(requests: Any, context: Any) -> None:
            await streaming(await receive(context), context)

        return grpc.stream_stream_rpc_method_handler(write, **serializers)
    if inspect.isasyncgenfunction(streaming):

        async def generate(requests: Any, context: Any) -> Any:
            async for response in streaming(await receive(context), context):
                yield response

        return grpc.stream_stream_rpc_method_handler(generate, **serializers)
    return handler


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """The bounds of the gRPC server (``ratekeeper serve`` options)."""

    max_message_bytes: int = 64 * 1024
    max_streams: int = 1000
    max_rpcs: int = 4096
    keepalive_seconds: float = 60.0
    idle_seconds: float = 300.0
    read_timeout: float = 10.0
    """A call's request message, and a new connection's handshake, must arrive within."""

    def options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", 4 * 1024 * 1024),
            ("grpc.max_concurrent_streams", self.max_streams),
            ("grpc.max_metadata_size", 16 * 1024),
            # The server pings an idle client every keepalive_seconds and drops it when no
            # answer comes within 20 s; a client may not ping more often than every 10 s.
            ("grpc.keepalive_time_ms", int(self.keepalive_seconds * 1000)),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ("grpc.http2.max_ping_strikes", 2),
            ("grpc.max_connection_idle_ms", int(self.idle_seconds * 1000)),
            # TLS and the HTTP/2 preface of a new connection (grpc's default: 120 s).
            ("grpc.server_handshake_timeout_ms", max(1, int(self.read_timeout * 1000))),
        ]


def build_grpc_server(
    service: Service,
    host: str,
    port: int,
    tokens: TokenSource | None = None,
    limits: GrpcLimits | None = None,
    tls: TlsState | None = None,
) -> tuple[Any, Health, int]:
    """A ``grpc.aio`` server with both services, bound to ``host:port`` (not started);
    returns it, its ``Health`` and the port bound (port 0 picks a free one)."""
    limits = limits or GrpcLimits()
    server = grpc.aio.server(
        # The deadline first: it wraps whatever handler the token check chose.
        interceptors=[ReceiveDeadline(limits.read_timeout), TokenInterceptor(tokens or TokenSource())],
        options=limits.options(),
        maximum_concurrent_rpcs=limits.max_rpcs,
    )
    servicer = RateLimitServicer(service)
    handlers = {
        "ShouldRateLimit": grpc.unary_unary_rpc_method_handler(
            servicer.ShouldRateLimit,
            request_deserializer=_request_or_malformed,
            response_serializer=rls_pb2.RateLimitResponse.SerializeToString,
        )
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    status = Health()
    health_pb2_grpc.add_HealthServicer_to_server(status.servicer, server)
    address = f"{_grpc_host(host)}:{port}"
    bound = (
        server.add_insecure_port(address) if tls is None else server.add_secure_port(address, tls.grpc_credentials())
    )
    if bound == 0:
        raise OSError(f"cannot bind the gRPC port {host}:{port}")
    return server, status, bound


def _grpc_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
