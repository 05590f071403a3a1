"""The test apps' configuration, passed from the test to the server process as JSON.

``RK_WEB_CONFIG`` holds ``{"store": URL, "rules": [...], "options": {...}}``. Each rule is
a small dict (``name``, ``limits``, optional ``path``, ``methods``, ``key``, ``algorithm``,
``cost``) built here into the ``HttpRule`` the rules file would give, so the apps do not
depend on the YAML loader; ``options`` go to the middleware as keywords, except that
``deny_response`` names one of ``DENY_RESPONSES`` (JSON carries no functions).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from ratekeeper import Rule
from ratekeeper.config.model import CLIENT_ADDRESS_KEY, HttpRule, KeyTemplate, Match, PathTemplate

__all__ = ["DENY_RESPONSES", "http_rule", "load", "metrics", "middleware_kwargs", "native"]


def http_rule(spec: dict[str, Any]) -> HttpRule:
    """One ``HttpRule`` from its test spec."""
    match = Match(
        methods=frozenset(m.upper() for m in spec.get("methods", ())),
        paths=tuple(PathTemplate.parse(p) for p in ([spec["path"]] if "path" in spec else [])),
    )
    cost = spec.get("cost", 1)
    return HttpRule(
        rule=Rule(spec["name"], spec["limits"], spec.get("algorithm", "gcra")),
        match=match,
        # no "key": the client's address, as a rules file without key (``"*"``: one global key)
        key=KeyTemplate.parse(spec["key"]) if "key" in spec else CLIENT_ADDRESS_KEY,
        cost=cost if isinstance(cost, int) else KeyTemplate.parse(cost),
        shadow=bool(spec.get("shadow", False)),
    )


def native(spec: dict[str, Any]) -> dict[str, Any]:
    """A test spec as the rules file's entry (``match: {path, methods}``): with
    ``"rules_as_dicts": true`` the apps hand these to the middleware as they are (Django:
    in ``settings.RATEKEEPER["rules"]``), for the product to read as it reads a user's."""
    entry = {k: spec[k] for k in ("name", "limits", "key", "cost", "shadow") if k in spec}
    entry["algorithm"] = spec.get("algorithm", "gcra")
    match = {"path": spec["path"]} if "path" in spec else {}
    if "methods" in spec:
        match["methods"] = [m.upper() for m in spec["methods"]]
    if match:
        entry["match"] = match
    return entry


def load() -> dict[str, Any]:
    """The configuration of this server process."""
    return dict(json.loads(os.environ["RK_WEB_CONFIG"]))


_metrics: Any = None


def metrics() -> Any:
    """This process's ``ratekeeper.metrics.Metrics`` (what the apps' ``/metrics`` expose)."""
    global _metrics  # noqa: PLW0603 - one registry per server process
    if _metrics is None:
        from ratekeeper.metrics import Metrics

        _metrics = Metrics()
    return _metrics


def bytes_denial(denied: Sequence[Any]) -> tuple[int, list[tuple[Any, Any]], bytes]:
    """A ``deny_response`` answering its headers as bytes (a 500 before they were accepted)."""
    return 429, [(b"X-Denied-By", denied[0].rule.encode()), ("Retry-After", b"7")], b"slow down"


DENY_RESPONSES = {"bytes": bytes_denial}


def middleware_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """``rules=``, ``store=`` and the other options, as the middleware takes them;
    ``"metrics": true`` gives it this process's ``metrics()``."""
    rules: Any = config["rules"]
    if not isinstance(rules, str):  # a path is passed through: the middleware loads the file
        rules = [native(r) if config.get("rules_as_dicts") else http_rule(r) for r in rules]
    kwargs = {"rules": rules, "store": config.get("store", "memory://"), **config.get("options", {})}
    if "deny_response" in kwargs:
        kwargs["deny_response"] = DENY_RESPONSES[kwargs["deny_response"]]
    if config.get("metrics"):
        kwargs["metrics"] = metrics()
    return kwargs
