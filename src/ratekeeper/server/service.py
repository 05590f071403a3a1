"""``Service``: what both transports share: the limiter, the metrics, the current rules.

One ``AsyncLimiter`` on one event loop serves HTTP and gRPC alike, so the memory store
is one state for both and a Redis or PostgreSQL store keeps one connection pool.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

from ratekeeper.config.envoy import EnvoyConfig
from ratekeeper.config.forms import load_any
from ratekeeper.config.model import RuleSet
from ratekeeper.config.settled import SETTLE, Signature, Unsettled, load_settled, signature
from ratekeeper.config.watcher import FORCED_ROUNDS
from ratekeeper.errors import ConfigurationError, StoreError
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.metrics import Metrics
from ratekeeper.rule import Rule
from ratekeeper.server.catalog import Catalog, build_catalog
from ratekeeper.server.logs import log

__all__ = [
    "PROBE",
    "RULES_SUFFIXES",
    "RulesFiles",
    "Service",
    "ServiceObserver",
    "redact",
    "rules_files",
    "rules_paths",
    "summary",
]

PROBE = Rule("ratekeeper.readyz", ["1/s"], on_error="raise")
"""The rule ``/readyz`` and gRPC health checking peek (never charged) to reach the store."""


RULES_SUFFIXES = (".yaml", ".yml")
"""The files of a rules directory that are read (dot files are skipped, as editors' and
Envoy's runtime loader leave them)."""


def rules_files(paths: Sequence[str]) -> list[str]:
    """The rules files named by ``paths``: a file as it is, a directory as every
    ``*.yaml`` / ``*.yml`` file directly in it, by name; ``OSError`` when one cannot be listed."""
    out: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            names = sorted(n for n in os.listdir(path) if n.endswith(RULES_SUFFIXES) and not n.startswith("."))
            out += [os.path.join(path, name) for name in names]
        else:
            out.append(path)
    return out


class RulesFiles:
    """The service's rules files and the ``Catalog`` they make together.

    ``paths`` are files or directories; a directory stands for the rules files in it, listed
    again at each look, so a file added or removed there, or the directory swapped for
    another by renaming a symlink over it (Envoy's runtime layout), is picked up.
    ``merge_domains`` merges the files of one domain (Envoy's ``MERGE_DOMAIN_CONFIG``);
    ``shadow`` is the service-wide shadow mode (Envoy's ``SHADOW_MODE``).

    ``reload`` (blocking: the service runs it on a worker thread) takes the files that
    changed, each once it has stood still for ``settle`` seconds
    (``ratekeeper.config.settled``), and gives one result for all of them: a new catalog,
    or the error that refused it (every file's problems, or a conflict between files).
    Refused, no file's new content is taken, and the same contents are not tried again
    until a file changes.
    """

    def __init__(
        self, paths: Sequence[str], settle: float = SETTLE, merge_domains: bool = False, shadow: bool = False
    ) -> None:
        self.paths = list(paths)
        self.settle = settle
        self.merge_domains = merge_domains
        self.shadow = shadow
        try:
            self.files = rules_files(self.paths)
        except OSError as exc:
            raise ConfigurationError(f"cannot list the rules directory: {exc}") from None
        self._signatures = [signature(path) for path in self.files]
        self._rules = [load_any(path) for path in self.files]
        self._tried = (tuple(self.files), tuple(self._signatures))

    def catalog(self) -> Catalog:
        """The catalog of the files as loaded; ``ConfigurationError`` when they conflict."""
        return self._build(self.files, self._rules)

    def _build(self, files: list[str], rules: list[RuleSet | EnvoyConfig]) -> Catalog:
        return build_catalog(list(zip(files, rules, strict=True)), self.merge_domains, self.shadow)

    def reload(self, force: bool) -> Catalog | str | None:
        """The catalog of the files' new content, or the error (text) that refused it;
        None when no file changed since the last try (or one is still being written).
        ``force`` (SIGHUP) loads every file again, changed or not, waiting a little longer
        for a file being written."""
        try:
            files = rules_files(self.paths)
        except OSError as exc:  # a directory mid-swap: looked at again at the next tick
            return f"cannot list the rules directory: {exc}" if force else None
        now = tuple(signature(path) for path in files)
        if not force and (tuple(files), now) == self._tried:
            return None
        known = dict(zip(self.files, zip(self._signatures, self._rules, strict=True), strict=True))
        rounds = FORCED_ROUNDS if force else 1
        signatures: list[Signature | None] = []
        rules: list[RuleSet | EnvoyConfig] = []
        errors: list[str] = []
        for i, path in enumerate(files):
            before = known.get(path)
            if not force and before is not None and now[i] == before[0]:
                signatures.append(before[0])
                rules.append(before[1])
                continue
            try:
                loaded = load_settled(path, load_any, self.settle, rounds)
            except Unsettled as exc:
                if not force:
                    return None  # looked at again at the next tick
                errors.append(str(exc))
                signatures.append(now[i])
                continue
            signatures.append(loaded.signature)
            if loaded.error is not None:
                errors.append(loaded.error)
            else:
                assert loaded.rules is not None
                rules.append(loaded.rules)
        self._tried = (tuple(files), tuple(signatures))
        if errors:
            return "\n".join(errors)
        try:
            catalog = self._build(files, rules)
        except ConfigurationError as exc:
            return str(exc)
        self.files, self._signatures, self._rules = files, signatures, rules
        return catalog


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
        self._reloading = asyncio.Lock()
        self._tasks: set[asyncio.Task[bool | None]] = set()

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    @catalog.setter
    def catalog(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self.metrics.shadow_rules(catalog.shadow_rules)
        self.metrics.configured_rules(catalog.every_rule)

    async def reload(self, reason: str, force: bool = False) -> bool | None:
        """Take the rules files' new content: on ``force`` (SIGHUP) every file is read
        again, else only changed ones are. True when new rules are in use, False when they
        were refused, None when nothing changed. The files are read and parsed on a worker
        thread, so the event loop keeps answering meanwhile; each reload that is tried
        logs one ``reload`` line and counts one result."""
        if self.files is None:
            if force:
                log("reload", ok=False, reason=reason, error="no rules file: the service runs its example rules")
            return None
        async with self._reloading:  # one at a time, so each result is swapped in in order
            try:
                outcome = await asyncio.to_thread(self.files.reload, force)
            except Exception as exc:  # noqa: BLE001 - a loader's bug refuses this reload, not the service
                outcome = f"the reload failed unexpectedly: {exc!r}"
            if outcome is None:
                return None
            if isinstance(outcome, str):
                self.metrics.reloaded(False)
                log("reload", level="error", ok=False, reason=reason, error=outcome)
                return False
            self.catalog = outcome
            self.metrics.reloaded(True)
            log("reload", ok=True, reason=reason, **summary(outcome))
            return True

    def reload_soon(self, reason: str, force: bool = False) -> None:
        """``reload`` as a task of the running loop, for a signal handler (which must not
        wait)."""
        task = asyncio.get_running_loop().create_task(self.reload(reason, force), name=f"reload ({reason})")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
    """The rules files and directories of ``--rules`` (repeatable) or ``RATEKEEPER_RULES``
    (paths separated by ``os.pathsep``)."""
    if value is None:
        return []
    items = value.split(os.pathsep) if isinstance(value, str) else list(value)
    return [p for p in items if p]


class ServiceObserver:
    """The limiter's observer: the metrics, plus a log line per circuit-breaker change.
    Charges and refunds (``/v1/refund``) are counted like the library's; the keys are
    asked for only when the OpenTelemetry backend records them (``--otel-record-key``)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.decided = metrics.decided
        self.charged = metrics.charged
        self.refunded = metrics.refunded
        self.wants_keys = metrics.wants_keys
        self.store_call = metrics.store_call
        self.decision_time = metrics.decision_time  # reported by /v1/check (server.core)

    def breaker_changed(self, old: str, new: str) -> None:
        self.metrics.breaker_changed(old, new)
        log("breaker", level="warning" if new != "closed" else "info", old=old, new=new)
