"""``Service``: what both transports share: the limiter, the metrics, the current rules.

One ``AsyncLimiter`` on one event loop serves HTTP and gRPC alike, so the memory store
is one state for both and a Redis or PostgreSQL store keeps one connection pool.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from typing import Any

from ratekeeper.config.envoy import EnvoyConfig
from ratekeeper.config.model import RuleSet
from ratekeeper.config.watcher import RulesWatcher
from ratekeeper.errors import ConfigurationError, StoreError
from ratekeeper.limiter.async_limiter import AsyncLimiter
from ratekeeper.metrics import Metrics
from ratekeeper.rule import Rule
from ratekeeper.server.catalog import Catalog, build_catalog
from ratekeeper.server.logs import log

__all__ = ["PROBE", "RulesFiles", "Service", "ServiceObserver", "redact", "rules_paths", "summary"]

PROBE = Rule("ratekeeper.readyz", ["1/s"], on_error="raise")
"""The rule ``/readyz`` and gRPC health checking peek (never charged) to reach the store."""


class RulesFiles:
    """The service's rules files, each watched by a ``RulesWatcher`` (reloaded when it
    changes), and the ``Catalog`` they make together."""

    def __init__(self, paths: Sequence[str], metrics: Metrics) -> None:
        self.metrics = metrics
        self.watchers = [RulesWatcher(path, on_reload=partial(self._reloaded, path)) for path in paths]
        self._seen = self._current()

    def _current(self) -> tuple[RuleSet | EnvoyConfig, ...]:
        return tuple(w.current for w in self.watchers)

    def _reloaded(self, path: str, ok: bool, error: str | None) -> None:
        if not ok:  # a file that failed to load: the old rules stay
            self.metrics.reloaded(False)
            log("reload", level="error", ok=False, file=path, error=error)

    def changed(self) -> bool:
        """Whether a file changed and loaded since the last ``catalog()`` (checks them)."""
        return any(a is not b for a, b in zip(self._current(), self._seen, strict=True))

    def force(self) -> None:
        """Load every file again now, changed or not (SIGHUP)."""
        for watcher in self.watchers:
            watcher.reload()

    def catalog(self) -> Catalog:
        """The catalog of the files as loaded; ``ConfigurationError`` when they conflict."""
        current = self._current()
        self._seen = current
        return build_catalog([(w.path, rules) for w, rules in zip(self.watchers, current, strict=True)])


class Service:
    """The limiter, the metrics and the current ``Catalog`` of a running service.

    ``files`` are the rules files (None: rules built in code, e.g. the examples); a
    reload that fails is logged and counted, and the old catalog stays.
    """

    def __init__(
        self,
        limiter: AsyncLimiter,
        metrics: Metrics,
        catalog: Catalog,
        files: RulesFiles | None = None,
        store_url: str = "memory://",
    ) -> None:
        self.limiter = limiter
        self.metrics = metrics
        self.store_url = store_url
        self.files = files
        self.catalog = catalog
        self._ready: bool | None = None

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    @catalog.setter
    def catalog(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self.metrics.shadow_rules(catalog.shadow_rules)
        self.metrics.configured_rules(catalog.rule_names)

    def reload(self, reason: str, force: bool = False) -> bool | None:
        """Take the rules files' new content: on ``force`` (SIGHUP) every file is read
        again, else only changed ones are. True when new rules are in use, False when they
        were refused, None when nothing changed."""
        if self.files is None:
            if force:
                log("reload", ok=False, reason=reason, error="no rules file: the service runs its example rules")
            return None
        if force:
            self.files.force()
        elif not self.files.changed():
            return None
        try:
            catalog = self.files.catalog()
        except ConfigurationError as exc:
            self.metrics.reloaded(False)
            log("reload", level="error", ok=False, reason=reason, error=str(exc))
            return False
        self.catalog = catalog
        self.metrics.reloaded(True)
        log("reload", ok=True, reason=reason, **summary(catalog))
        return True

    async def store_problem(self) -> str | None:
        """None when the store answers a peek; else what went wrong. A change is logged."""
        try:
            await self.limiter.peek(PROBE, "probe")
        except StoreError as exc:
            problem: str | None = f"{type(exc).__name__}: {exc}"
        else:
            problem = None
        ready = problem is None
        if ready != self._ready:
            if self._ready is not None or not ready:
                fields: dict[str, Any] = {"reachable": ready, "store": redact(self.store_url)}
                if problem:
                    fields["error"] = problem
                log("store", level="info" if ready else "error", **fields)
            self._ready = ready
        return problem


def summary(catalog: Catalog) -> dict[str, Any]:
    """The fields of a start or reload log line that describe the rules."""
    return {
        "sources": list(catalog.sources) or ["<example rules>"],
        "rules": [r.name for r in catalog.rules],
        "envoy_domains": sorted(catalog.envoy),
    }


def redact(url: str) -> str:
    """``url`` without its password, for logs."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def rules_paths(value: str | Sequence[str] | None) -> list[str]:
    """The rules files of ``--rules`` (repeatable) or ``RATEKEEPER_RULES`` (paths separated
    by ``os.pathsep``)."""
    if value is None:
        return []
    items = value.split(os.pathsep) if isinstance(value, str) else list(value)
    return [p for p in items if p]


class ServiceObserver:
    """The limiter's observer: the metrics, plus a log line per circuit-breaker change."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.decided = metrics.decided
        self.store_call = metrics.store_call

    def breaker_changed(self, old: str, new: str) -> None:
        self.metrics.breaker_changed(old, new)
        log("breaker", level="warning" if new != "closed" else "info", old=old, new=new)
