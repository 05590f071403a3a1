"""``ratekeeper serve``: the JSON-over-HTTP API (a decision surface and an admin surface)
and Envoy's gRPC rate-limit service."""

from __future__ import annotations

import argparse
import math
import os

from ratekeeper.errors import RateKeeperError
from ratekeeper.rule import POLICIES
from ratekeeper.server.envoy_charging import CHARGING, service_charging

__all__ = ["add_parser", "run"]

ENV = {
    "rules": "RATEKEEPER_RULES",
    "store": "RATEKEEPER_STORE",
    "host": "RATEKEEPER_HOST",
    "http_port": "RATEKEEPER_HTTP_PORT",
    "grpc_port": "RATEKEEPER_GRPC_PORT",
    "admin_host": "RATEKEEPER_ADMIN_HOST",
    "admin_port": "RATEKEEPER_ADMIN_PORT",
    "store_api": "RATEKEEPER_STORE_API",
    "decision_token_file": "RATEKEEPER_DECISION_TOKEN_FILE",
    "admin_token_file": "RATEKEEPER_ADMIN_TOKEN_FILE",
    "tls_cert": "RATEKEEPER_TLS_CERT",
    "tls_key": "RATEKEEPER_TLS_KEY",
    "tls_client_ca": "RATEKEEPER_TLS_CLIENT_CA",
    "read_timeout": "RATEKEEPER_READ_TIMEOUT",
    "keep_alive_timeout": "RATEKEEPER_KEEP_ALIVE_TIMEOUT",
    "max_header_bytes": "RATEKEEPER_MAX_HEADER_BYTES",
    "max_connections": "RATEKEEPER_MAX_CONNECTIONS",
    "grpc_max_message_bytes": "RATEKEEPER_GRPC_MAX_MESSAGE_BYTES",
    "grpc_max_streams": "RATEKEEPER_GRPC_MAX_STREAMS",
    "grpc_max_rpcs": "RATEKEEPER_GRPC_MAX_RPCS",
    "grpc_keepalive": "RATEKEEPER_GRPC_KEEPALIVE",
    "grpc_idle_timeout": "RATEKEEPER_GRPC_IDLE_TIMEOUT",
    "grpc_read_timeout": "RATEKEEPER_GRPC_READ_TIMEOUT",
    "on_error": "RATEKEEPER_ON_ERROR",
    "over_limit_cache": "RATEKEEPER_OVER_LIMIT_CACHE",
    "merge_domains": "MERGE_DOMAIN_CONFIG",
    "shadow_mode": "SHADOW_MODE",
    "otel": "RATEKEEPER_OTEL",
    "otel_record_key": "RATEKEEPER_OTEL_RECORD_KEY",
    "workers": "RATEKEEPER_WORKERS",
}
"""The environment variable read for each option the command line leaves out."""

TOKENS_ENV = {"decision": "RATEKEEPER_DECISION_TOKENS", "admin": "RATEKEEPER_ADMIN_TOKENS"}
"""The tokens themselves (one name:secret a line), when no token file is given."""

OFF = "off"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="serve rate-limit decisions over HTTP (JSON) and gRPC (Envoy's rate-limit service)",
        description=(
            "Serve rate-limit decisions, in one process (or --workers N): the decision surface over "
            "HTTP (POST /v1/check, /v1/peek, Envoy's POST /json, GET /healthz, /readyz, /openapi.json) and "
            "Envoy's gRPC rate-limit service with gRPC health checking; the admin surface on its own port "
            "(POST /v1/reset, /v1/refund, GET /v1/rules, /metrics, and /v1/store with --store-api). Without "
            "--rules it serves example rules on the memory store and prints them. SIGHUP reloads the rules, "
            "TLS and token files (a rules change is also picked up within a second); SIGTERM stops "
            "gracefully. Each option falls back to an environment variable: "
            + ", ".join(f"{v} (--{k.replace('_', '-')})" for k, v in ENV.items())
            + "; the tokens themselves may be given in "
            + " and ".join(TOKENS_ENV.values())
            + " (never on the command line). See docs/service.md."
        ),
        epilog="example: ratekeeper serve --rules rules.yaml --rules envoy.yaml --store redis://localhost:6379/0",
    )
    p.add_argument(
        "--rules",
        action="append",
        metavar="PATH",
        help="a rules file, native or Envoy form, or a directory of them (every *.yaml and *.yml in it, listed "
        "again at each look, so a symlink swapped to another directory reloads; repeatable: one native file, "
        f"one Envoy file per domain unless --merge-domains; {ENV['rules']} takes paths separated by {os.pathsep!r})",
    )
    p.add_argument(
        "--merge-domains",
        action="store_true",
        default=None,
        help="merge Envoy files of one domain (their descriptors side by side) instead of refusing the second "
        "(Envoy's MERGE_DOMAIN_CONFIG)",
    )
    p.add_argument(
        "--shadow-mode",
        action="store_true",
        default=None,
        help="service-wide shadow mode for the Envoy domains: every descriptor is decided and counted, no "
        "request is refused (Envoy's SHADOW_MODE)",
    )
    p.add_argument("--store", help="store URL (default: memory://)")
    p.add_argument(
        "--otel",
        action="store_true",
        default=None,
        help="also export the metrics and a span per decision through OpenTelemetry, to the exporters the "
        "standard OTEL_* variables name (needs opentelemetry-sdk and the exporter; see docs/observability.md)",
    )
    p.add_argument(
        "--otel-record-key",
        action="store_true",
        default=None,
        help="with --otel: each span also carries the decision's key (ratekeeper.key, at most 128 characters); "
        "off by default, since keys are often user ids, addresses or API keys",
    )
    p.add_argument(
        "--workers",
        metavar="N",
        help="serve with N processes sharing the decision HTTP and gRPC ports (SO_REUSEPORT) under one "
        "supervisor that restarts a worker that dies and passes SIGHUP and SIGTERM on; worker i serves the "
        "admin surface on --admin-port + i; needs a shared store (redis://, postgresql://), not memory:// "
        "(default: 1, one process; see docs/deployment.md)",
    )
    p.add_argument("--host", help="address of the decision surface, HTTP and gRPC (default: 127.0.0.1)")
    p.add_argument("--http-port", help="decision surface HTTP port (default: 8080; 0 picks a free one; off)")
    p.add_argument("--grpc-port", help="gRPC port (default: 8081; 0 picks a free one; off)")
    p.add_argument("--admin-host", help="address of the admin surface (default: 127.0.0.1)")
    p.add_argument("--admin-port", help="admin surface HTTP port (default: 8082; 0 picks a free one; off)")
    p.add_argument(
        "--store-api",
        action="store_true",
        default=None,
        help="serve POST /v1/store on the admin surface: other limiters may use this service as their store",
    )
    p.add_argument("--decision-token-file", metavar="FILE", help="bearer tokens of the decision surface and gRPC")
    p.add_argument("--admin-token-file", metavar="FILE", help="bearer tokens of the admin surface")
    p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain: TLS on every listener")
    p.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", metavar="FILE", help="require client certificates signed by these PEM CAs")
    limits = p.add_argument_group("defences of each listener (see docs/service.md)")
    limits.add_argument("--read-timeout", metavar="SECONDS", help="a request must arrive whole within (default: 10)")
    limits.add_argument(
        "--keep-alive-timeout", metavar="SECONDS", help="an idle connection is closed after (default: 5)"
    )
    limits.add_argument(
        "--max-header-bytes", metavar="BYTES", help="request line and headers, at most (default: 32768)"
    )
    limits.add_argument("--max-connections", metavar="N", help="open connections per HTTP listener (default: 1000)")
    limits.add_argument("--grpc-max-message-bytes", metavar="BYTES", help="a gRPC request, at most (default: 65536)")
    limits.add_argument("--grpc-max-streams", metavar="N", help="streams per gRPC connection (default: 1000)")
    limits.add_argument("--grpc-max-rpcs", metavar="N", help="gRPC calls in progress, at most (default: 4096)")
    limits.add_argument("--grpc-keepalive", metavar="SECONDS", help="ping an idle gRPC client every (default: 60)")
    limits.add_argument(
        "--grpc-idle-timeout", metavar="SECONDS", help="close an idle gRPC connection after (default: 300)"
    )
    limits.add_argument(
        "--grpc-read-timeout",
        metavar="SECONDS",
        help="a gRPC call's request message, and a connection's handshake, must arrive within (default: 10)",
    )
    p.add_argument(
        "--on-error",
        choices=POLICIES,
        help="what answers when the store fails (default: raise: HTTP 503, gRPC UNAVAILABLE; rules may override)",
    )
    p.add_argument(
        "--envoy-charging",
        choices=CHARGING,
        help="which descriptors of an Envoy request are charged when one is over its limit, for the domains "
        "whose file does not say (default: envoy, every one that fits; stop_over_limit: none, as Envoy's "
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true, also read; transaction: ratekeeper's one decision)",
    )
    p.add_argument(
        "--over-limit-cache",
        action="store_true",
        default=None,
        help="answer a key's denial in this process until its retry_after has passed (a Redis or PostgreSQL "
        "store then pays no round trip for a flooding key; never admits more; see docs/service.md)",
    )


def _port(value: int | str | None, default: int, name: str) -> int | None:
    """A port number; None for ``off`` (that listener is not started)."""
    if value is None or value == "":
        return default
    if isinstance(value, str) and value.strip().lower() == OFF:
        return None
    try:
        port = int(value)
    except ValueError:
        raise RateKeeperError(f"{name} must be a port number or {OFF!r}, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise RateKeeperError(f"{name} must be a port from 0 to 65535 or {OFF!r}, got {port}")
    return port


def _number(value: str | None, default: float, name: str, *, integer: bool) -> float:
    """A positive number (a whole one when ``integer``)."""
    if value is None or value == "":
        return default
    try:
        number = int(value) if integer else float(value)
    except ValueError:
        kind = "a whole number" if integer else "a number of seconds"
        raise RateKeeperError(f"{name} must be {kind} greater than 0, got {value!r}") from None
    if not number > 0 or not math.isfinite(number):
        raise RateKeeperError(f"{name} must be greater than 0, got {value!r}")
    return number


def _flag(value: bool | None, env_value: str | None) -> bool:
    return bool(value) or (env_value or "").lower() in ("1", "true", "yes", "on")


def run(args: argparse.Namespace) -> int:
    from ratekeeper.server.grpc_service import GrpcLimits
    from ratekeeper.server.http_server import HttpLimits
    from ratekeeper.server.process import Settings, TokenOptions
    from ratekeeper.server.process import run as serve
    from ratekeeper.server.service import rules_paths
    from ratekeeper.server.tls import TlsFiles

    env = os.environ

    def option(name: str) -> str | None:
        value = getattr(args, name)
        return value if value is not None else env.get(ENV[name])

    def number(name: str, default: float, integer: bool = False) -> float:
        return _number(option(name), default, f"--{name.replace('_', '-')}", integer=integer)

    cert, key, client_ca = option("tls_cert"), option("tls_key"), option("tls_client_ca")
    if bool(cert) != bool(key):
        raise RateKeeperError("--tls-cert and --tls-key go together; give both (or neither, for no TLS)")
    if client_ca and not cert:
        raise RateKeeperError("--tls-client-ca needs --tls-cert and --tls-key: client certificates are part of TLS")
    http_limits = HttpLimits(
        read_timeout=number("read_timeout", 10.0),
        keep_alive=max(1, math.ceil(number("keep_alive_timeout", 5))),
        max_header_bytes=int(number("max_header_bytes", 32 * 1024, integer=True)),
        max_connections=int(number("max_connections", 1000, integer=True)),
    )
    grpc_limits = GrpcLimits(
        max_message_bytes=int(number("grpc_max_message_bytes", 64 * 1024, integer=True)),
        max_streams=int(number("grpc_max_streams", 1000, integer=True)),
        max_rpcs=int(number("grpc_max_rpcs", 4096, integer=True)),
        keepalive_seconds=number("grpc_keepalive", 60.0),
        idle_seconds=number("grpc_idle_timeout", 300.0),
        read_timeout=number("grpc_read_timeout", 10.0),
    )
    on_error = args.on_error or env.get(ENV["on_error"]) or "raise"
    if on_error not in POLICIES:
        raise RateKeeperError(f"{ENV['on_error']} must be one of {', '.join(POLICIES)}, got {on_error!r}")
    otel = _flag(args.otel, env.get(ENV["otel"]))
    otel_record_key = _flag(args.otel_record_key, env.get(ENV["otel_record_key"]))
    if otel_record_key and not otel:
        raise RateKeeperError("--otel-record-key puts keys on OpenTelemetry spans: it needs --otel (RATEKEEPER_OTEL=1)")
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
        admin_host=option("admin_host") or "127.0.0.1",
        admin_port=_port(option("admin_port"), 8082, "--admin-port"),
        store_api=_flag(args.store_api, env.get(ENV["store_api"])),
        decision_tokens=TokenOptions(
            option("decision_token_file"), env.get(TOKENS_ENV["decision"]), TOKENS_ENV["decision"]
        ),
        admin_tokens=TokenOptions(option("admin_token_file"), env.get(TOKENS_ENV["admin"]), TOKENS_ENV["admin"]),
        tls=TlsFiles(cert, key, client_ca or None) if cert and key else None,
        http_limits=http_limits,
        grpc_limits=grpc_limits,
        on_error=on_error,
        over_limit_cache=_flag(args.over_limit_cache, env.get(ENV["over_limit_cache"])),
        envoy_charging=service_charging(args.envoy_charging, env),
        merge_domains=_flag(args.merge_domains, env.get(ENV["merge_domains"])),
        shadow_mode=_flag(args.shadow_mode, env.get(ENV["shadow_mode"])),
        otel=otel,
        otel_record_key=otel_record_key,
    )
    return serve(settings, workers=int(number("workers", 1, integer=True)))
