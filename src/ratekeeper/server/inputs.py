"""The JSON bodies of ``/v1/*``, checked field by field before anything is charged.

Each reader checks the body against its route's schema (``schema.py``: the same
schemas ``/openapi.json`` publishes) and returns plain values, or raises ``BadInput``
(400) naming the field, what it got and what is accepted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ratekeeper.config.model import HttpRule, RuleSet
from ratekeeper.limiter.transaction import Entry
from ratekeeper.server.problems import BadInput
from ratekeeper.server.schema import MAX_CHECKS, MAX_COST, MAX_LEASE_ID, check, request_schemas, type_name

__all__ = [
    "MAX_BODY",
    "MAX_CHECKS",
    "MAX_COST",
    "MAX_LEASE_ID",
    "Check",
    "parse_json",
    "read_check",
    "read_checks",
    "read_refund",
    "read_reset",
    "rule_schemas",
    "type_name",
]

MAX_BODY = 64 * 1024
"""The largest request body, in bytes; a larger one is refused with 413."""


@dataclass(frozen=True, slots=True)
class Check:
    """One rule (as the rules file has it), key and cost of a request."""

    rule: HttpRule
    key: str
    cost: int


_LAST: list[tuple[RuleSet, dict[str, Any]]] = []
"""The schemas of the rules in force, made once per rule set (a reload makes a new one)."""


def rule_schemas(rules: RuleSet) -> dict[str, Any]:
    """The request schemas under ``rules`` (the rules in force)."""
    if _LAST and _LAST[0][0] is rules:
        return _LAST[0][1]
    names = [r.name for r in rules]
    leased = [r.name for r in rules if r.rule.algorithm == "concurrency"]
    schemas = request_schemas(names, leased)
    _LAST[:] = [(rules, schemas)]
    return schemas


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse_json(body: bytes) -> Any:
    """The JSON document in ``body`` (UTF-8), or ``BadInput`` saying where it breaks."""
    if not body.strip():
        raise BadInput(400, "the request body is empty", "a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(400, f"the request body is not UTF-8 (byte {exc.start})", "a JSON object in UTF-8") from None
    try:
        if text.startswith("\ufeff"):  # as json.loads refuses it
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        doc = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise BadInput(
            400, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", "a JSON object"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise BadInput(400, f"malformed JSON: {exc}", "a JSON object") from None
    if _SURROGATE_ESCAPE.search(text) is not None:
        _refuse_lone_surrogates(doc)
    return doc


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose names are unique (I-JSON, RFC 7493): with a name given twice,
    the service and a proxy or log in front of it could each read another value (the key
    charged is not the key logged), so such a body is refused."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise ValueError(f"the name {name[:64]!r} is given twice in one object")
            seen.add(name)
    return doc


_DECODER = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=_object_without_duplicates)
"""``json.loads(text, parse_constant=..., object_pairs_hook=...)`` without building a decoder
per request."""

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A ``\\uD800``-``\\uDFFF`` escape: the only way a UTF-8 body gives a surrogate."""


def _refuse_lone_surrogates(doc: Any) -> None:
    """The service takes Unicode text (I-JSON, RFC 7493): an escape that makes a lone
    surrogate is refused here, for every route, since no store can encode one."""
    try:
        json.dumps(doc, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        raise BadInput(
            400,
            f"the body holds a lone surrogate (U+{ord(exc.object[exc.start]):04X}), which is not Unicode text",
            "JSON whose strings are Unicode text (a surrogate escape only as half of a pair)",
        ) from None


def _rule(name: str, rules: RuleSet) -> HttpRule:
    rule = rules.by_name.get(name)
    if rule is None:  # a rules file without rules: the schema has no names to list
        raise BadInput(400, f"unknown rule {name!r}", f"one of the rules of {rules.source}: (none)", rule=name)
    return rule


def _check(obj: dict[str, Any], rules: RuleSet) -> Check:
    return Check(_rule(obj["rule"], rules), obj["key"], obj.get("cost", 1))


def read_check(body: Any, rules: RuleSet) -> Check:
    """``{"rule": ..., "key": ..., "cost": 1}``."""
    return _check(check(rule_schemas(rules), "Check", body), rules)


def _entry(obj: dict[str, Any], rules: RuleSet) -> Entry:
    rule = _rule(obj["rule"], rules)
    return Entry(rule.rule, obj["key"], obj.get("cost", 1), rule.shadow)


def read_checks(body: Any, rules: RuleSet) -> list[Entry] | Entry:
    """One check, or ``{"checks": [...]}``: a list of 1 to ``MAX_CHECKS`` checks; each as an
    entry of the request's transaction (``ratekeeper.limiter.transaction.Entry``: the rule
    that decides, the key, the cost, and whether the rule is a shadow rule)."""
    if isinstance(body, dict) and "checks" in body:
        obj = check(rule_schemas(rules), "Checks", body)
        return [_entry(item, rules) for item in obj["checks"]]
    return _entry(check(rule_schemas(rules), "Check", body), rules)


def read_refund(body: Any, rules: RuleSet) -> tuple[Check, str | None]:
    """``{"rule": ..., "key": ..., "cost": 1, "lease_id": null}``: a lease_id for a
    concurrency rule (which needs one), none for any other."""
    obj = check(rule_schemas(rules), "Refund", body)
    return _check(obj, rules), obj.get("lease_id")


def read_reset(body: Any, rules: RuleSet) -> Check:
    """``{"rule": ..., "key": ...}``."""
    obj = check(rule_schemas(rules), "Reset", body)
    return Check(_rule(obj["rule"], rules), obj["key"], 0)
