"""The rules the tour serves: the example rules of ``ratekeeper serve`` and two more, a
hot tenant's and an API whose per-account limits come from a quota provider (a stand-in
for a billing system, defined here so the rules file can name it)."""

from __future__ import annotations

from pathlib import Path

from ratekeeper.quota import QuotaAnswer
from ratekeeper.server.examples import EXAMPLE_ENVOY, EXAMPLE_RULES

__all__ = [
    "FAILSAFE",
    "HOT_LIMIT",
    "PLANS",
    "QUOTA_MAX_KEYS",
    "STORE_MAX_KEYS",
    "TOUR_RULES",
    "plan_of",
    "write_rules",
]

HOT_LIMIT = "1000/minute"
"""The hot tenant's limit: the tour sends more than this on one key and counts what passed."""
FAILSAFE = "3/minute"
"""What an account of ``api.calls`` gets until (or unless) its plan is known."""
QUOTA_MAX_KEYS = 1000
"""Accounts whose plan the quota keeps: a flood of unknown ids cannot grow it further."""
STORE_MAX_KEYS = 2000
"""Keys the memory store keeps per rule (``memory://?max_keys=``), least recently used dropped first."""

PLANS = {"alice@example.com": "10/minute", "carol@example.com": "100/s"}
"""What the stand-in billing system knows: each paying account's plan."""

TOUR_RULES = f"""\
  - name: tenant.requests
    key: "{{header.x-tenant}}"
    limits: ["{HOT_LIMIT}"]
    algorithm: sliding_window_log
  - name: api.calls
    key: "{{header.x-account-id}}"
    limits: ["{FAILSAFE}"]
    quota: {{provider: "ratekeeper.tour.rules:plan_of", ttl: 300, max_keys: {QUOTA_MAX_KEYS}}}
"""
"""Appended to the example rules (same indentation, same ``rules:`` list)."""


def plan_of(account: str) -> QuotaAnswer:
    """The quota provider: a paying account's plan; any other account gets the failsafe
    (answered rather than raised, so a flood of unknown ids does not fill the log)."""
    return PLANS.get(account, FAILSAFE)


def write_rules(directory: Path) -> list[Path]:
    """The tour's rules files in ``directory``: the native form and the Envoy form."""
    directory.mkdir(parents=True, exist_ok=True)
    native, envoy = directory / "rules.yaml", directory / "envoy.yaml"
    native.write_text(EXAMPLE_RULES + TOUR_RULES)
    envoy.write_text(EXAMPLE_ENVOY)
    return [native, envoy]
