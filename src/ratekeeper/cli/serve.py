"""``ratekeeper serve``: the JSON-over-HTTP API and Envoy's gRPC rate-limit service."""

from __future__ import annotations

import argparse
import os

from ratekeeper.errors import RateKeeperError
from ratekeeper.rule import POLICIES

__all__ = ["add_parser", "run"]

ENV = {
    "rules": "RATEKEEPER_RULES",
    "store": "RATEKEEPER_STORE",
    "host": "RATEKEEPER_HOST",
    "http_port": "RATEKEEPER_HTTP_PORT",
    "grpc_port": "RATEKEEPER_GRPC_PORT",
    "on_error": "RATEKEEPER_ON_ERROR",
    "over_limit_cache": "RATEKEEPER_OVER_LIMIT_CACHE",
}
"""The environment variable read for each option the command line leaves out."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="serve rate-limit decisions over HTTP (JSON) and gRPC (Envoy's rate-limit service)",
        description=(
            "Serve rate-limit decisions: JSON over HTTP (POST /v1/check, /v1/peek, /v1/refund, /v1/reset, "
            "GET /v1/rules, /healthz, /readyz, /metrics, /openapi.json, Envoy's POST /json) and Envoy's "
            "gRPC rate-limit service with gRPC health checking, in one process. Without --rules it serves "
            "example rules on the memory store and prints them. SIGHUP reloads the rules files (a change "
            "is also picked up within a second); SIGTERM stops gracefully. Each option falls back to an "
            "environment variable: " + ", ".join(f"{v} (--{k.replace('_', '-')})" for k, v in ENV.items()) + "."
        ),
        epilog="example: ratekeeper serve --rules rules.yaml --rules envoy.yaml --store redis://localhost:6379/0",
    )
    p.add_argument(
        "--rules",
        action="append",
        metavar="FILE",
        help="a rules file, native or Envoy form (repeatable: one native file, one Envoy file per domain; "
        f"{ENV['rules']} takes paths separated by {os.pathsep!r})",
    )
    p.add_argument("--store", help="store URL (default: memory://)")
    p.add_argument("--host", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--http-port", type=int, help="HTTP port (default: 8080; 0 picks a free one)")
    p.add_argument("--grpc-port", type=int, help="gRPC port (default: 8081; 0 picks a free one)")
    p.add_argument(
        "--on-error",
        choices=POLICIES,
        help="what answers when the store fails (default: raise: HTTP 503, gRPC UNAVAILABLE; rules may override)",
    )
    p.add_argument(
        "--over-limit-cache",
        action="store_true",
        default=None,
        help="answer a key's denial in this process until its retry_after has passed (a Redis or PostgreSQL "
        "store then pays no round trip for a flooding key; never admits more; see docs/service.md)",
    )


def _port(value: int | str | None, default: int, name: str) -> int:
    if value is None or value == "":
        return default
    try:
        port = int(value)
    except ValueError:
        raise RateKeeperError(f"{name} must be a port number, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise RateKeeperError(f"{name} must be a port from 0 to 65535, got {port}")
    return port


def run(args: argparse.Namespace) -> int:
    from ratekeeper.server.process import Settings
    from ratekeeper.server.process import run as serve
    from ratekeeper.server.service import rules_paths

    env = os.environ
    on_error = args.on_error or env.get(ENV["on_error"]) or "raise"
    if on_error not in POLICIES:
        raise RateKeeperError(f"{ENV['on_error']} must be one of {', '.join(POLICIES)}, got {on_error!r}")
    settings = Settings(
        rules=tuple(rules_paths(args.rules if args.rules else env.get(ENV["rules"]))),
        store=args.store or env.get(ENV["store"]) or "memory://",
        host=args.host or env.get(ENV["host"]) or "127.0.0.1",
        http_port=_port(
            args.http_port if args.http_port is not None else env.get(ENV["http_port"]), 8080, "--http-port"
        ),
        grpc_port=_port(
            args.grpc_port if args.grpc_port is not None else env.get(ENV["grpc_port"]), 8081, "--grpc-port"
        ),
        on_error=on_error,
        over_limit_cache=bool(args.over_limit_cache)
        or env.get(ENV["over_limit_cache"], "").lower() in ("1", "true", "yes", "on"),
    )
    return serve(settings)
