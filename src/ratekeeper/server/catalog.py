"""``Catalog``: the rules the service answers with, as loaded from its rules files.

The native form (``rules:``) names the rules of ``/v1/*``; each Envoy-form file
(``domain:``) serves one domain of the gRPC service and of ``POST /json``. A reload
builds a whole new ``Catalog`` and swaps it in one assignment, so a request sees the old
rules or the new ones, never a mix; a file that fails to load leaves the old catalog.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ratekeeper.config.envoy import EnvoyConfig
from ratekeeper.config.model import RuleSet
from ratekeeper.errors import ConfigurationError

__all__ = ["Catalog", "build_catalog"]


@dataclass(frozen=True, slots=True)
class Catalog:
    """The native rules (by name) and the Envoy configurations (by domain)."""

    rules: RuleSet
    envoy: Mapping[str, EnvoyConfig] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    @property
    def rule_names(self) -> list[str]:
        """The names of every configured rule, native and Envoy: the metrics' rule labels."""
        names = [r.name for r in self.rules]
        for config in self.envoy.values():
            names += [rule.name for rule in config.rules]
        return names

    @property
    def shadow_rules(self) -> list[str]:
        """The names of the rules in shadow mode, for the metrics."""
        names = [r.name for r in self.rules if r.shadow]
        for config in self.envoy.values():
            names += [n.rule.name for n in config.nodes if n.shadow and n.rule is not None]
        return names

    def describe(self) -> dict[str, Any]:
        """What ``GET /v1/rules`` answers."""
        return {
            "sources": list(self.sources),
            "rules": [
                {
                    "name": r.name,
                    "limits": [str(limit) for limit in r.rule.limits],
                    "algorithm": r.rule.algorithm,
                    "burst": r.rule.burst,
                    "on_error": r.rule.on_error,
                    "shadow": r.shadow,
                }
                for r in self.rules
            ],
            "envoy_domains": sorted(self.envoy),
        }


def build_catalog(loaded: Sequence[tuple[str, RuleSet | EnvoyConfig]]) -> Catalog:
    """The catalog of loaded rules files (``(path, rules)`` pairs): at most one of the
    native form, any number of the Envoy form with distinct domains, and no two rules of
    one name; else ``ConfigurationError``."""
    native: RuleSet | None = None
    envoy: dict[str, EnvoyConfig] = {}
    for path, rules in loaded:
        if isinstance(rules, RuleSet):
            if native is not None:
                raise ConfigurationError(
                    f"{path}: a second native rules file (the first is {native.source}); "
                    "the service takes one native file and any number of Envoy files"
                )
            native = rules
            continue
        if rules.domain in envoy:
            raise ConfigurationError(
                f"{path}: domain {rules.domain!r} is already served by {envoy[rules.domain].source}"
            )
        envoy[rules.domain] = rules
    _check_names(native, envoy.values())
    return Catalog(native or RuleSet(()), envoy, tuple(path for path, _ in loaded))


def _check_names(native: RuleSet | None, envoy: Iterable[EnvoyConfig]) -> None:
    """A rule's name is its state's namespace in the store, so two rules of one name (a
    native rule and an Envoy descriptor's rate limit, or the limits of two domains named
    alike) would count against each other: refused, naming both places."""
    where: dict[str, str] = {}
    if native is not None:
        where = {r.name: r.origin or native.source for r in native}
    for config in envoy:
        for node in config.nodes:
            if node.rule is None:
                continue
            name = node.rule.name
            other = where.setdefault(name, node.origin)
            if other != node.origin:
                raise ConfigurationError(
                    f"{node.origin}: the rate limit {name!r} has the name of the rule at {other}; rules that "
                    "share a name share their counts: rename one of them (an Envoy rate limit takes name: ...)"
                )
