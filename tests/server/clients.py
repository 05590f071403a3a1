"""Real clients of a running service: httpx for HTTP, grpcio with Envoy's messages for gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc
import httpx
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import wrappers_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT


def descriptor(*entries: tuple[str, str], hits: int | None = None) -> Any:
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    return d


def envoy_request(domain: str, descriptors: Sequence[Any], hits: int = 0) -> Any:
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=list(descriptors), hits_addend=hits)


def should_rate_limit(target: str, request: Any, timeout: float = 10.0) -> Any:
    with grpc.insecure_channel(target) as channel:
        return rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=timeout)


async def many_grpc(target: str, requests: Sequence[Any]) -> list[Any]:
    """Send every request at once over one channel; the responses in order."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        return list(await asyncio.gather(*(stub.ShouldRateLimit(r, timeout=10) for r in requests)))


async def many_http(url: str, path: str, bodies: Sequence[Any]) -> list[httpx.Response]:
    """POST every body at once; the responses in order."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        return list(await asyncio.gather(*(client.post(path, json=b) for b in bodies)))


def health(target: str, service: str = "") -> int:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(reply.status)


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
