"""Rules files (YAML, the native and the Envoy form): loading, validation, reload.

The one loader that the middleware (``ratekeeper.web``), the service
(``ratekeeper.server``) and ``ratekeeper config check`` share. See docs/architecture.md
and docs/rules-file.md.

- ``load_rules(path) -> RuleSet``: the native form (``rules:``).
- ``rules_from(obj) -> RuleSet``: a path, a ``RuleSet``, or rules built in code.
- ``ConfigProblems``: raised by every loader, holding every problem of the file.
"""

from __future__ import annotations

from ratekeeper.config.model import HttpRule, KeyTemplate, Match, PartLookup, PathTemplate, RuleSet
from ratekeeper.config.native import load_rules, parse_rules
from ratekeeper.config.problems import ConfigProblems
from ratekeeper.config.sources import rules_from

__all__ = [
    "ConfigProblems",
    "HttpRule",
    "KeyTemplate",
    "Match",
    "PartLookup",
    "PathTemplate",
    "RuleSet",
    "load_rules",
    "parse_rules",
    "rules_from",
]
