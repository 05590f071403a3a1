"""``status_doc``: what ``GET /status.json`` answers, the page's one source of data.

Everything in it is already readable on the admin surface (``/v1/rules``, ``/metrics``,
``/readyz``); it is gathered here so the page makes one request per refresh. Nothing in
it changes state: the store probe is the peek ``/readyz`` makes.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from ratekeeper.server.service import Service, redact
from ratekeeper.server.status_page.history import KINDS, DecisionHistory

__all__ = ["history_of", "status_doc"]

_HISTORIES: weakref.WeakKeyDictionary[Service, DecisionHistory] = weakref.WeakKeyDictionary()


def history_of(service: Service) -> DecisionHistory:
    """The decision history of ``service``, made on first use (the sampler and the page share it)."""
    history = _HISTORIES.get(service)
    if history is None:
        history = _HISTORIES[service] = DecisionHistory(service.metrics)
    return history


def _rules(service: Service) -> list[dict[str, Any]]:
    catalog = service.catalog
    out: list[dict[str, Any]] = []
    for r in catalog.rules:
        out.append(
            {
                "name": r.name,
                "form": "native",
                "limits": [str(limit) for limit in r.rule.limits],
                "algorithm": r.rule.algorithm,
                "shadow": r.shadow,
            }
        )
    for domain, config in sorted(catalog.envoy.items()):
        for node in config.nodes:
            if node.rule is None:
                continue
            out.append(
                {
                    "name": node.rule.name,
                    "form": "envoy",
                    "domain": domain,
                    "limits": [str(limit) for limit in node.rule.limits],
                    "algorithm": node.rule.algorithm,
                    "shadow": node.shadow or config.global_shadow,
                }
            )
    return out


async def status_doc(service: Service) -> dict[str, Any]:
    """The rules, the recent decisions per rule, the store's health, the breaker, the reloads."""
    problem = await service.store_problem()
    history = history_of(service)
    metrics = service.metrics
    rules = _rules(service)
    decisions = history.series()
    quiet = [0] * len(decisions["times"])
    for rule in rules:  # a configured rule without decisions yet is charted flat, not missing
        decisions["rules"].setdefault(rule["name"], {kind: list(quiet) for kind in KINDS})
    return {
        "now": time.time(),
        "sources": list(service.catalog.sources) or ["<example rules>"],
        "rules": rules,
        "store": {"url": redact(service.store_url), "reachable": problem is None, "problem": problem},
        "breaker": service.limiter.breaker.state,
        "reloads": {
            "ok": int(metrics.value("ratekeeper_config_reloads_total", result="ok") or 0),
            "failed": int(metrics.value("ratekeeper_config_reloads_total", result="failed") or 0),
            "recent": list(history.reloads),
        },
        "decisions": decisions,
    }
