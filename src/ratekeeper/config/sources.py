"""``rules_from``: whatever a user hands the middleware as ``rules=``, as a ``RuleSet``."""

from __future__ import annotations

import os
from collections.abc import Iterable

from ratekeeper.config.checks import redundant_limits
from ratekeeper.config.model import HttpRule, RuleSet
from ratekeeper.config.native import load_rules
from ratekeeper.errors import ConfigurationError
from ratekeeper.rule import Rule

__all__ = ["rules_from"]

RulesSource = str | os.PathLike[str] | RuleSet | Rule | HttpRule | Iterable[Rule | HttpRule]


def rules_from(obj: RulesSource) -> RuleSet:
    """A ``RuleSet`` from a path to a native-form file, a ``RuleSet``, or rules built in code.

    A bare ``Rule`` becomes ``HttpRule(rule)``: it matches every request and, like a rule
    of a file without ``key``, keys each client by its address (``{client_ip}``); for one
    budget every client shares, give ``HttpRule(rule, key=KeyTemplate.parse("*"))``.
    Two rules with one name are a ``ConfigurationError``; a file with problems
    raises ``ConfigProblems``. Rules built in code get the same redundant-limit warnings a
    file would.
    """
    if isinstance(obj, RuleSet):
        return obj
    if isinstance(obj, str | os.PathLike):
        return load_rules(obj)
    items: Iterable[object] = [obj] if isinstance(obj, Rule | HttpRule) else obj
    if not isinstance(items, Iterable):
        raise ConfigurationError(
            f"rules must be a path to a rules file, a RuleSet, or a list of Rule / HttpRule, got {obj!r}"
        )
    out: list[HttpRule] = []
    warnings: list[str] = []
    for item in items:
        http_rule = HttpRule(item) if isinstance(item, Rule) else item
        if not isinstance(http_rule, HttpRule):
            raise ConfigurationError(f"each rule must be a Rule or an HttpRule, got {item!r}")
        out.append(http_rule)
        for b, a in redundant_limits(http_rule.rule.limits, http_rule.rule.burst):
            warnings.append(f"<code>: warning: rule {http_rule.name!r}: limit {b} can never bind beside {a}; remove it")
    return RuleSet(tuple(out), source="<code>", warnings=tuple(warnings))
