"""``rules_from``: whatever a user hands the middleware as ``rules=``, as a ``RuleSet``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from ratekeeper.config.checks import redundant_limits
from ratekeeper.config.model import HttpRule, RuleSet
from ratekeeper.config.native import load_rules, rules_of_data
from ratekeeper.errors import ConfigurationError
from ratekeeper.rule import Rule

__all__ = ["rules_from"]

RuleData = Mapping[str, Any]
"""A rules file's entry as Python data: ``{"name": "login", "limits": ["5/minute"]}``."""
RulesSource = str | os.PathLike[str] | RuleSet | Rule | HttpRule | RuleData | Iterable[Rule | HttpRule | RuleData]


def rules_from(obj: RulesSource, source: str = "<code>") -> RuleSet:
    """A ``RuleSet`` from a path to a native-form file, a ``RuleSet``, or rules built in code.

    Rules in code are ``Rule``s, ``HttpRule``s, or the rules file's entries as Python data
    (``{"name": "login", "limits": ["5/minute"], "match": {"path": "/login"}}``), checked
    as a file's are; a mapping with ``rules`` is a whole file's document. ``source`` names
    them in messages (``app.config['RATEKEEPER_RULES'][1]: ...``).

    A bare ``Rule`` becomes ``HttpRule(rule)``: it matches every request and, like a rule
    of a file without ``key``, keys each client by its address (``{client_ip}``); for one
    budget every client shares, give ``HttpRule(rule, key="*")``.
    Two rules with one name are a ``ConfigurationError``; a file with problems
    raises ``ConfigProblems``. Rules built in code get the same redundant-limit warnings a
    file would.
    """
    if isinstance(obj, RuleSet):
        return obj
    if isinstance(obj, str | os.PathLike):
        return load_rules(obj)
    if isinstance(obj, Mapping):
        return rules_of_data(obj, source)
    items: Iterable[object] = [obj] if isinstance(obj, Rule | HttpRule) else obj
    if not isinstance(items, Iterable):
        raise ConfigurationError(
            f"rules must be a path to a rules file, a RuleSet, or a list of Rule / HttpRule / rule mappings, "
            f"got {obj!r}"
        )
    items = list(items)
    at = [i for i, item in enumerate(items) if isinstance(item, Mapping)]
    data = rules_of_data([items[i] for i in at], source, at) if at else RuleSet(())
    from_data = iter(data)
    out: list[HttpRule] = []
    warnings = list(data.warnings)
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            out.append(next(from_data))
            continue
        http_rule = HttpRule(item) if isinstance(item, Rule) else item
        if not isinstance(http_rule, HttpRule):
            raise ConfigurationError(
                f"{source}[{i}]: each rule must be a Rule, an HttpRule or a mapping as in a rules file "
                f'({{"name": "login", "limits": ["5/minute"]}}), got {item!r}'
            )
        out.append(http_rule)
        for b, a in redundant_limits(http_rule.rule.limits, http_rule.rule.burst):
            warnings.append(
                f"{source}: warning: rule {http_rule.name!r}: limit {b} can never bind beside {a}; remove it"
            )
    return RuleSet(tuple(out), source=source, warnings=tuple(warnings))
