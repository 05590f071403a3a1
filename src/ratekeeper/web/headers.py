"""The rate-limit headers of a response (DESIGN.md 5.3).

Two families, each of which can be switched off:

- ``RateLimit-Policy`` and ``RateLimit``, the structured fields of
  draft-ietf-httpapi-ratelimit-headers-11: one list member per limit of every enforced
  rule that decided the request. A rule with one limit is one policy named after the
  rule (``"items.list";q=1;w=2`` and ``"items.list";r=0;t=2``); a rule with several
  limits names each after the rule and the limit's window (``"auth.create_token.60s"``,
  ``"auth.create_token.3s"``). ``q`` is the limit's count, ``w`` its period and ``t``
  the seconds until more quota (the refusing limit's retry time on a denial, else the
  time until the limit is whole again), all whole seconds rounded up (``w`` at least 1).
- ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset``: one limit only, the one that
  refused (the latest to free up, when several did) or else the one with the least left;
  ``-Reset`` in seconds from now, rounded up.

``Retry-After`` (a denial only) is the time until every refusing rule admits the
request again, in whole seconds rounded up and never 0; it is left out when the cost can
never be admitted (it exceeds a limit's capacity).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit

__all__ = [
    "policy_names",
    "ratelimit_fields",
    "retry_after_seconds",
    "sf_string",
    "whole_seconds",
    "x_ratelimit_fields",
]

_US = 1_000_000


def whole_seconds(us: int) -> int:
    """Microseconds as whole seconds, rounded up (never negative)."""
    return max(0, -(-us // _US))


def sf_string(text: str) -> str:
    """``text`` as a structured-field String (RFC 8941 §3.3.3): quoted, escaped, printable ASCII."""
    safe = "".join(ch if " " <= ch <= "~" else "?" for ch in text)
    return '"' + safe.replace("\\", "\\\\").replace('"', '\\"') + '"'


def policy_names(rule: str, limits: Sequence[Limit]) -> list[str]:
    """The policy name of each limit of ``rule`` (see the module docstring)."""
    if len(limits) == 1:
        return [rule]
    windows = [_window(limit) for limit in limits]
    return [f"{rule}.{w}" if windows.count(w) == 1 else f"{rule}.{w}.{i}" for i, w in enumerate(windows)]


def _window(limit: Limit) -> str:
    us = limit.period_us
    return f"{us // _US}s" if us % _US == 0 else f"{us // 1000}ms" if us % 1000 == 0 else f"{us}us"


def _limit_t(decision: Decision, i: int) -> int:
    """``t`` of limit ``i``: seconds until it admits more (see the module docstring)."""
    if i == decision.denied_index and decision.retry_us != INFINITE:
        return max(1, whole_seconds(decision.retry_us))
    return whole_seconds(decision.reset_us[i])


@lru_cache(maxsize=1024)
def _policy(rule: str, limits: tuple[Limit, ...]) -> tuple[tuple[str, ...], str]:
    """(the sf-String of each limit's policy name, the rule's ``RateLimit-Policy`` members).

    Cached: both depend only on the rule's name and limits (bounded by the configuration,
    and by ``maxsize`` for per-key quotas), and building them is most of a header's cost.
    """
    items = tuple(sf_string(name) for name in policy_names(rule, limits))
    members = ", ".join(
        f"{item};q={limit.count};w={max(1, whole_seconds(limit.period_us))}"
        for item, limit in zip(items, limits, strict=True)
    )
    return items, members


def ratelimit_fields(decisions: Iterable[Decision]) -> list[tuple[str, str]]:
    """``RateLimit-Policy`` and ``RateLimit`` for the enforced decisions of one request.

    One member per policy: when several decisions of a request share a rule and limits
    (a batch checking several keys of one rule), the field names the policy once and
    reports its tightest state (least remaining, then longest wait), so a client reading
    one item per policy reads the one that binds.
    """
    policy: dict[str, str] = {}
    state: dict[str, tuple[int, int]] = {}
    for d in decisions:
        limits = d.rule_limits
        if not limits:
            continue  # a key that no limit applies to: nothing to advertise
        items, members = _policy(d.rule, limits)
        policy.setdefault(members, members)
        remaining = d.remaining_each
        for i, item in enumerate(items):
            now = (max(0, remaining[i]), _limit_t(d, i))
            seen = state.get(item)
            if seen is None or (now[0], -now[1]) < (seen[0], -seen[1]):
                state[item] = now
    if not policy:
        return []
    return [
        ("RateLimit-Policy", ", ".join(policy)),
        ("RateLimit", ", ".join(f"{item};r={r};t={t}" for item, (r, t) in state.items())),
    ]


def _reported(decisions: Sequence[Decision]) -> tuple[Decision, int] | None:
    """The decision and limit index that ``X-RateLimit-*`` report."""
    denied = [d for d in decisions if not d.allowed and d.rule_limits and d.denied_index >= 0]
    if denied:
        d = max(denied, key=lambda d: float("inf") if d.retry_us == INFINITE else d.retry_us)
        return d, d.denied_index
    best: tuple[Decision, int] | None = None
    for d in decisions:
        for i in range(len(d.rule_limits)):
            if best is None:
                best = (d, i)
                continue
            bd, bi = best
            if (d.remaining_each[i], -d.reset_us[i]) < (bd.remaining_each[bi], -bd.reset_us[bi]):
                best = (d, i)
    return best


def x_ratelimit_fields(decisions: Sequence[Decision]) -> list[tuple[str, str]]:
    """``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset`` for the enforced decisions."""
    reported = _reported(decisions)
    if reported is None:
        return []
    d, i = reported
    limit = d.rule_limits[i]
    return [
        ("X-RateLimit-Limit", str(limit.count)),
        ("X-RateLimit-Remaining", str(max(0, d.remaining_each[i]))),
        ("X-RateLimit-Reset", str(_limit_t(d, i))),
    ]


def retry_after_seconds(decisions: Iterable[Decision]) -> int | None:
    """Whole seconds (at least 1) until every refusing decision admits; None when never."""
    worst = 0
    for d in decisions:
        if d.allowed:
            continue
        if d.retry_us == INFINITE:
            return None
        worst = max(worst, d.retry_us)
    return max(1, whole_seconds(worst))
