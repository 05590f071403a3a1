"""What the server benchmarks (``bench web``, ``bench serve``) ask of their surroundings:
the versions to report, whether Redis answers, and the store URL of a case."""

from __future__ import annotations

import importlib.metadata
import socket
from collections.abc import Iterable
from urllib.parse import quote, urlsplit

from ratekeeper_bench.options import describe

__all__ = ["redis_reachable", "store_url", "versions"]


def versions(names: Iterable[str]) -> dict[str, str]:
    """The installed version of each of ``names`` (the ones not installed are left out)."""
    found: dict[str, str] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def redis_reachable(url: str) -> str | None:
    """None when Redis at ``url`` accepts a connection, else why not (a case's skip reason)."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=2.0):
            return None
    except OSError as exc:
        return f"Redis is not reachable at {url}: {describe(exc)}"


def store_url(store: str, redis_url: str, prefix: str) -> str:
    """The URL of a case's store: ``memory://``, or ``redis_url`` with the run's key prefix."""
    if store != "redis":
        return "memory://"
    joiner = "&" if "?" in redis_url else "?"
    return f"{redis_url}{joiner}prefix={quote(prefix, safe='')}"
