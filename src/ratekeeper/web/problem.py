"""The body of a 429: ``application/problem+json`` (RFC 9457) with the ``quota-exceeded``
problem type of draft-ietf-httpapi-ratelimit-headers-11.

Fields: ``type``, ``title``, ``status`` (429), ``detail`` (for people), ``violated-policies``
(the policy names of the refusing limits, as in the ``RateLimit`` header), and ours:
``rule`` (the refusing rule that frees up last), ``limit`` (its refusing limit, e.g.
``"1/3s"``) and ``retry_after`` (whole seconds, the value of ``Retry-After``; null when
the cost can never be admitted).

A request refused because the limiter could not decide (its store unreachable, and a rule's
``on_error: deny``) is not over any quota: it is answered ``503`` with the problem type
``LIMITER_UNAVAILABLE`` (``unavailable_body``), ``Retry-After`` the circuit breaker's
remaining cool-down, and no quota headers, so clients and dashboards can tell an outage
from a client over its limit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit
from ratekeeper.web.headers import policy_names

__all__ = [
    "LIMITER_UNAVAILABLE",
    "LIMITER_UNAVAILABLE_STATUS",
    "PROBLEM_CONTENT_TYPE",
    "QUOTA_EXCEEDED",
    "QUOTA_EXCEEDED_TITLE",
    "problem",
    "problem_body",
    "unavailable_body",
]

PROBLEM_CONTENT_TYPE = "application/problem+json"
QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
QUOTA_EXCEEDED_TITLE = "Request cannot be satisfied as assigned quota has been exceeded"
# A URN: a stable name that no one has to host (RFC 9457 only asks for a URI).
LIMITER_UNAVAILABLE = "urn:ratekeeper:problem:limiter-unavailable"
LIMITER_UNAVAILABLE_TITLE = "The rate limiter cannot decide: its store is unreachable"
LIMITER_UNAVAILABLE_STATUS = 503


def problem(denied: Sequence[Decision], retry_after: int | None, status: int = 429) -> dict[str, Any]:
    """The problem document for the refusing decisions of one request."""
    return _document(*_refusal(denied), retry_after, status)


def problem_body(denied: Sequence[Decision], retry_after: int | None, status: int = 429) -> bytes:
    """``problem(...)`` as UTF-8 JSON."""
    if retry_after is not None and len(denied) == 1:
        # One refusing rule, the usual refusal: its body is fixed but for the retry time.
        d = denied[0]
        key = (d.rule, d.denied_index, status)
        known = _one_rule_bodies.get(key)
        if known is None or (known[0] is not d.rule_limits and known[0] != d.rule_limits):
            known = _remember_one_rule_body(key, d)
        seconds = str(retry_after)
        return (known[1] + seconds + known[2] + seconds + "}").encode()
    return _body(*_refusal(denied), retry_after, status)


_one_rule_bodies: dict[tuple[str, int, int], tuple[tuple[Limit, ...], str, str]] = {}
"""(rule, refusing limit's index, status) -> (the rule's limits, the body before the retry
time in ``detail``, the body between it and the final ``retry_after`` value)."""
_MAX_ONE_RULE_BODIES = 1024  # rule names come from the rules, not from clients; a bound all the same


def _remember_one_rule_body(key: tuple[str, int, int], decision: Decision) -> tuple[tuple[Limit, ...], str, str]:
    """The parts of ``_body`` for a refusal by ``decision`` alone that do not change with the
    retry time. JSON escapes a string character by character, so the detail's text around the
    retry time (digits: never escaped) encodes as the whole detail would."""
    violated, rule, limit = _refusal((decision,))
    status = key[2]
    assert rule is not None
    dumps = json.dumps
    head = (
        f'{{"type":{dumps(QUOTA_EXCEEDED)},"title":{dumps(QUOTA_EXCEEDED_TITLE)},"status":{dumps(status)},'
        f'"detail":{dumps(f"Rule {rule!r} admits {limit}; retry in ")[:-1]}'
    )
    middle = (
        f'{dumps(" s.")[1:]},"violated-policies":{dumps(list(violated), separators=(",", ":"))},'
        f'"rule":{dumps(rule)},"limit":{dumps(limit)},"retry_after":'
    )
    if len(_one_rule_bodies) >= _MAX_ONE_RULE_BODIES:
        _one_rule_bodies.clear()
    known = (decision.rule_limits, head, middle)
    _one_rule_bodies[key] = known
    return known


def _refusal(denied: Sequence[Decision]) -> tuple[tuple[str, ...], str | None, str | None]:
    """The policy names of the refusing limits, and the rule that frees up last with its limit."""
    violated: list[str] = []
    for d in denied:
        if d.denied_index >= 0:  # the one limit of ``d.limits`` that is ``denied``
            violated.append(policy_names(d.rule, d.rule_limits)[d.denied_index])
    main = max(denied, key=lambda d: float("inf") if d.retry_us == INFINITE else d.retry_us) if denied else None
    if main is None:
        return tuple(violated), None, None
    return tuple(violated), main.rule, None if main.denied_by is None else str(main.denied_by)


def _document(
    violated: tuple[str, ...], rule: str | None, limit: str | None, retry_after: int | None, status: int
) -> dict[str, Any]:
    if rule is None:
        detail = "Too many requests."
    elif retry_after is None:
        detail = f"The request costs more than rule {rule!r} ever admits ({limit}); it will not be admitted."
    else:
        detail = f"Rule {rule!r} admits {limit}; retry in {retry_after} s."
    return {
        "type": QUOTA_EXCEEDED,
        "title": QUOTA_EXCEEDED_TITLE,
        "status": status,
        "detail": detail,
        "violated-policies": list(violated),
        "rule": rule,
        "limit": limit,
        "retry_after": retry_after,
    }


@lru_cache(maxsize=256)
def _body(
    violated: tuple[str, ...], rule: str | None, limit: str | None, retry_after: int | None, status: int
) -> bytes:
    # Cached: the refusals of a client over its limit repeat the same few bodies (the
    # retry time moves once a second), and encoding the JSON is most of a refusal's cost.
    return json.dumps(_document(violated, rule, limit, retry_after, status), separators=(",", ":")).encode()


def unavailable_body(denied: Sequence[Decision], retry_after: int | None) -> bytes:
    """The problem document of a request refused because the limiter's store is unreachable
    and a refusing rule fails closed (``on_error: deny``)."""
    rules = sorted({d.rule for d in denied if d.fallback == "deny"})
    doc = {
        "type": LIMITER_UNAVAILABLE,
        "title": LIMITER_UNAVAILABLE_TITLE,
        "status": LIMITER_UNAVAILABLE_STATUS,
        "detail": (
            f"The rate limiter's store is unreachable and rule {', '.join(map(repr, rules))} refuses requests "
            f"then (on_error: deny); this is not a quota. Retry in {retry_after} s."
        ),
        "rules": rules,
        "retry_after": retry_after,
    }
    return json.dumps(doc, separators=(",", ":")).encode()
