"""Rules files (YAML, the native and the Envoy form): loading, validation, reload.

The one loader that the middleware (``ratekeeper.web``), the service
(``ratekeeper.server``) and ``ratekeeper config check`` share. See docs/architecture.md
and docs/rules-file.md.

- ``load_rules(path) -> RuleSet``: the native form (``rules:``).
- ``rules_from(obj) -> RuleSet``: a path, a ``RuleSet``, or rules built in code.
- ``load_envoy(path) -> EnvoyConfig``: the Envoy form (``domain:``, ``descriptors:``).
- ``load_any(path)``: either form, told apart by a top-level ``domain``.
- ``RulesWatcher``: the rules of a file, reloaded when it changes; a bad file is refused.
- ``ConfigProblems``: raised by every loader, holding every problem of the file.
"""

from __future__ import annotations

from ratekeeper.config.envoy import EnvoyConfig, EnvoyLimit, load_envoy, parse_envoy
from ratekeeper.config.forms import load_any, parse_any
from ratekeeper.config.model import HttpRule, KeyTemplate, Match, PartLookup, PathTemplate, RuleSet
from ratekeeper.config.native import load_rules, parse_rules
from ratekeeper.config.problems import ConfigProblems
from ratekeeper.config.sources import rules_from
from ratekeeper.config.watcher import RulesWatcher

__all__ = [
    "ConfigProblems",
    "EnvoyConfig",
    "EnvoyLimit",
    "HttpRule",
    "KeyTemplate",
    "Match",
    "PartLookup",
    "PathTemplate",
    "RuleSet",
    "RulesWatcher",
    "load_any",
    "load_envoy",
    "load_rules",
    "parse_any",
    "parse_envoy",
    "parse_rules",
    "rules_from",
]
