"""The gRPC side: Envoy's ``RateLimitService`` and gRPC health checking, on ``grpc.aio``.

``ShouldRateLimit`` answers as ``envoy.should_rate_limit`` decides. A bad request is
``INVALID_ARGUMENT`` with the reason; a store that fails under the ``raise`` policy is
``UNAVAILABLE`` (Envoy then applies its ``failure_mode_deny``). Health checking
(``grpc.health.v1.Health``) reports ``SERVING`` while the store answers and
``NOT_SERVING`` when it does not, for the overall server ("") and for the rate-limit
service by name; ``Health`` watchers are told of each change.
"""

from __future__ import annotations

from typing import Any

import grpc  # type: ignore[import-untyped]
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from ratekeeper.errors import InvalidRequest, StoreError
from ratekeeper.server.envoy import should_rate_limit
from ratekeeper.server.problems import BadInput
from ratekeeper.server.service import Service

__all__ = ["SERVICE_NAME", "RateLimitServicer", "build_grpc_server"]

SERVICE_NAME = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"].full_name
"""``envoy.service.ratelimit.v3.RateLimitService``: the name health checking answers for."""


class RateLimitServicer(rls_pb2_grpc.RateLimitServiceServicer):  # type: ignore[misc]
    """``ShouldRateLimit`` over the service's limiter and Envoy-form rules."""

    def __init__(self, service: Service) -> None:
        self.service = service

    async def ShouldRateLimit(self, request: Any, context: Any) -> Any:
        self.service.metrics.request("grpc")
        try:
            return await should_rate_limit(self.service, request)
        except (BadInput, InvalidRequest) as exc:
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


def build_grpc_server(service: Service, host: str, port: int) -> tuple[Any, Health, int]:
    """A ``grpc.aio`` server with both services, bound to ``host:port`` (not started);
    returns it, its ``Health`` and the port bound (port 0 picks a free one)."""
    server = grpc.aio.server()
    rls_pb2_grpc.add_RateLimitServiceServicer_to_server(RateLimitServicer(service), server)
    status = Health()
    health_pb2_grpc.add_HealthServicer_to_server(status.servicer, server)
    bound = server.add_insecure_port(f"{_grpc_host(host)}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind the gRPC port {host}:{port}")
    return server, status, bound


def _grpc_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
