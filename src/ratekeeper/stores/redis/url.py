"""Redis URLs: where a store connects (``RedisTarget``), and its options.

- ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS), ``valkey://``,
  ``valkeys://`` (TLS), ``unix:///path/to.sock[?db=N]``
- ``redis+sentinel://[[user]:password@]host:port[,host:port…]/service_name[/db]``
- ``redis+cluster://[[user]:password@]host:port[,host:port…]``

Store options (``prefix``, ``timeout``, ``batching``, ``max_in_flight``, ``max_batch``,
``max_connections``) may come from the query string or as keywords; anything else is
refused with the list of accepted options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ratekeeper.errors import ConfigurationError

__all__ = ["OPTIONS", "REDIS_SCHEMES", "RedisTarget", "parse_redis_url"]

REDIS_SCHEMES = ("redis", "rediss", "valkey", "valkeys", "unix", "redis+sentinel", "redis+cluster")
OPTIONS = ("prefix", "timeout", "batching", "max_in_flight", "max_batch", "max_connections")


@dataclass(frozen=True)
class RedisTarget:
    """Where the store connects: a standalone server, a Sentinel service or a Cluster."""

    kind: str  # "standalone" | "sentinel" | "cluster"
    url: str = ""  # standalone: a URL redis-py's from_url understands
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    options: dict[str, Any] = field(default_factory=dict)


def _nodes(netloc_hosts: str, url: str, default_port: int) -> tuple[tuple[str, int], ...]:
    nodes = []
    for part in netloc_hosts.split(","):
        host, _, port = part.strip().rpartition(":") if ":" in part else (part.strip(), "", str(default_port))
        host = host.strip("[]")
        if not host:
            raise ConfigurationError(f"{url!r}: expected host:port[,host:port...], got {netloc_hosts!r}")
        try:
            nodes.append((host, int(port)))
        except ValueError:
            raise ConfigurationError(f"{url!r}: port {port!r} is not a number") from None
    return tuple(nodes)


def parse_redis_url(url: str, **keywords: Any) -> RedisTarget:
    """Parse a Redis/Valkey URL; store options from its query and ``keywords`` (keywords win)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    query = dict(parse_qsl(parts.query))
    options = {k: v for k, v in query.items() if k in OPTIONS}
    options.update(keywords)
    passthrough = {k: v for k, v in query.items() if k not in OPTIONS}
    unknown = set(keywords) - set(OPTIONS)
    if scheme in ("redis+sentinel", "redis+cluster") and passthrough:
        unknown |= set(passthrough)
    if unknown:
        raise ConfigurationError(f"unknown option(s) {sorted(unknown)} for {scheme}://; accepted: {', '.join(OPTIONS)}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    user = unquote(username) or None
    secret = unquote(password) or None
    if scheme in ("redis", "rediss", "valkey", "valkeys", "unix"):
        real = {"valkey": "redis", "valkeys": "rediss"}.get(scheme, scheme)
        kept = "&".join(f"{k}={v}" for k, v in passthrough.items())
        rebuilt = f"{real}://{parts.netloc}{parts.path}" + (f"?{kept}" if kept else "")
        return RedisTarget("standalone", url=rebuilt, ssl=real == "rediss", options=options)
    if scheme == "redis+sentinel":
        path = [p for p in parts.path.split("/") if p]
        if not path or len(path) > 2:
            raise ConfigurationError(f"{url!r}: expected redis+sentinel://host:port[,host:port...]/service_name[/db]")
        try:
            db = int(path[1]) if len(path) == 2 else 0
        except ValueError:
            raise ConfigurationError(f"{url!r}: the database {path[1]!r} is not a number") from None
        return RedisTarget(
            "sentinel",
            nodes=_nodes(hosts, url, 26379),
            service=path[0],
            db=db,
            username=user,
            password=secret,
            options=options,
        )
    if scheme == "redis+cluster":
        if parts.path.strip("/"):
            raise ConfigurationError(f"{url!r}: a cluster has no databases; expected redis+cluster://host:port[,...]")
        return RedisTarget("cluster", nodes=_nodes(hosts, url, 6379), username=user, password=secret, options=options)
    raise ConfigurationError(f"{url!r} is not a Redis URL; expected one of {', '.join(REDIS_SCHEMES)}")
