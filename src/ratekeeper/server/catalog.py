"""``Catalog``: the rules the service answers with, as loaded from its rules files.

The native form (``rules:``) names the rules of ``/v1/*``; each Envoy-form file
(``domain:``) serves one domain of the gRPC service and of ``POST /json`` (several files
of one domain are merged when the service is told to, as Envoy's ``MERGE_DOMAIN_CONFIG``).
The service-wide shadow mode (Envoy's ``SHADOW_MODE``) is set on every domain. A reload
builds a whole new ``Catalog`` and swaps it in one assignment, so a request sees the old
rules or the new ones, never a mix; a file that fails to load leaves the old catalog.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ratekeeper.config.envoy import EnvoyConfig, merge_envoy
from ratekeeper.config.model import RuleSet
from ratekeeper.errors import ConfigurationError
from ratekeeper.rule import Rule

__all__ = ["Catalog", "build_catalog"]


@dataclass(frozen=True, slots=True)
class Catalog:
    """The native rules (by name) and the Envoy configurations (by domain)."""

    rules: RuleSet
    envoy: Mapping[str, EnvoyConfig] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    @property
    def every_rule(self) -> list[Rule]:
        """Every configured rule, native and Envoy: the metrics' rule labels and limits."""
        rules = [r.rule for r in self.rules]
        for config in self.envoy.values():
            rules += config.rules
        return rules

    @property
    def shadow_rules(self) -> list[str]:
        """The names of the rules in shadow mode, for the metrics."""
        names = [r.name for r in self.rules if r.shadow]
        for config in self.envoy.values():
            names += [n.rule.name for n in config.nodes if (n.shadow or config.global_shadow) and n.rule is not None]
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


def build_catalog(
    loaded: Sequence[tuple[str, RuleSet | EnvoyConfig]], merge_domains: bool = False, shadow: bool = False
) -> Catalog:
    """The catalog of loaded rules files (``(path, rules)`` pairs): at most one of the
    native form, any number of the Envoy form with distinct domains (or, with
    ``merge_domains``, files of one domain merged), and no two rules of one name; else
    ``ConfigurationError``. ``shadow`` puts every Envoy domain in shadow mode."""
    native: RuleSet | None = None
    envoy: dict[str, EnvoyConfig] = {}
    merged: dict[str, list[EnvoyConfig]] = {}
    for path, rules in loaded:
        if isinstance(rules, RuleSet):
            if native is not None:
                raise ConfigurationError(
                    f"{path}: a second native rules file (the first is {native.source}); "
                    "the service takes one native file and any number of Envoy files"
                )
            native = rules
            continue
        if rules.domain in envoy and not merge_domains:
            raise ConfigurationError(
                f"{path}: domain {rules.domain!r} is already served by {envoy[rules.domain].source}; "
                "give each domain one file, or merge them (--merge-domains, MERGE_DOMAIN_CONFIG=true)"
            )
        merged.setdefault(rules.domain, []).append(rules)
        envoy[rules.domain] = rules
    for domain, configs in merged.items():
        config = merge_envoy(configs) if len(configs) > 1 else configs[0]
        envoy[domain] = config.shadowed() if shadow else config
    _check_names(native, envoy.values())
    return Catalog(native or RuleSet(()), envoy, tuple(path for path, _ in loaded))


def _check_names(native: RuleSet | None, envoy: Iterable[EnvoyConfig]) -> None:
    """A rule's name is its state's namespace in the store, so two rules of one name (a
    native rule named like an Envoy descriptor's path) would count against each other:
    refused, naming both places. Envoy rules are named by their descriptor paths, which
    differ between domains and descriptors, whatever their YAML ``name``."""
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
                    "share a name share their counts: rename the native rule (an Envoy rate limit's rule is "
                    "named by its descriptor path, domain.key_value...)"
                )
