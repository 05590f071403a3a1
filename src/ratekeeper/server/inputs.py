"""The JSON bodies of ``/v1/*``, checked field by field before anything is charged.

Each reader returns plain values or raises ``BadInput`` (400) naming the field, what it
got and what is accepted. The rules of the bodies are also written in the OpenAPI
document (``openapi.py``): ``MAX_COST``, ``MAX_CHECKS``, ``MAX_KEY_LENGTH``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ratekeeper.config.model import HttpRule, RuleSet
from ratekeeper.rule import MAX_KEY_LENGTH
from ratekeeper.server.problems import BadInput

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
    "type_name",
]

MAX_BODY = 64 * 1024
"""The largest request body, in bytes; a larger one is refused with 413."""

MAX_COST = 2**32 - 1
"""The largest cost a request may carry (Envoy's ``hits_addend`` is a uint32 too)."""

MAX_CHECKS = 100
"""The most checks one ``{"checks": [...]}`` batch may hold."""

MAX_LEASE_ID = 128
"""The longest ``lease_id`` a refund may name (the limiter's are 32 characters)."""


@dataclass(frozen=True, slots=True)
class Check:
    """One rule (as the rules file has it), key and cost of a request."""

    rule: HttpRule
    key: str
    cost: int


def type_name(value: object) -> str:
    """The JSON name of ``value``'s type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


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
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise BadInput(
            400, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", "a JSON object"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise BadInput(400, f"malformed JSON: {exc}", "a JSON object") from None


def _object(value: Any, where: str, fields: Sequence[str], required: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise BadInput(400, f"{where} must be a JSON object, got {type_name(value)}", _shape(fields, required))
    unknown = [f for f in value if f not in fields]
    if unknown:
        raise BadInput(400, f"unknown field {unknown[0]!r} in {where}", _shape(fields, required))
    missing = [f for f in required if f not in value]
    if missing:
        raise BadInput(400, f"{where} lacks the field {missing[0]!r}", _shape(fields, required))
    return value


def _shape(fields: Sequence[str], required: Sequence[str]) -> str:
    return "an object with " + ", ".join(f"{f!r}" + ("" if f in required else " (optional)") for f in fields)


def _rule(value: Any, where: str, rules: RuleSet) -> HttpRule:
    if not isinstance(value, str):
        raise BadInput(400, f"{where}.rule must be a string, got {type_name(value)}", "the name of a rule")
    rule = rules.by_name.get(value)
    if rule is None:
        names = [r.name for r in rules]
        shown = ", ".join(repr(n) for n in names[:20]) + (", ..." if len(names) > 20 else "")
        raise BadInput(
            400, f"unknown rule {value!r}", f"one of the rules of {rules.source}: {shown or '(none)'}", rule=value
        )
    return rule


def _key(value: Any, where: str) -> str:
    accepted = f"a non-empty string of at most {MAX_KEY_LENGTH} characters"
    if not isinstance(value, str):
        raise BadInput(400, f"{where}.key must be a string, got {type_name(value)}", accepted)
    if not value:
        raise BadInput(400, f"{where}.key is empty", accepted)
    if len(value) > MAX_KEY_LENGTH:
        raise BadInput(400, f"{where}.key is {len(value)} characters long", accepted)
    return value


def _cost(value: Any, where: str) -> int:
    accepted = f"an integer from 0 to {MAX_COST} (default 1)"
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON has one number type: 2.0 is the integer 2 (as JSON Schema says)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(400, f"{where}.cost must be an integer, got {type_name(value)} {value!r}", accepted)
    if not 0 <= value <= MAX_COST:
        raise BadInput(400, f"{where}.cost {value} is out of range", accepted)
    return value


_CHECK_FIELDS = ("rule", "key", "cost")


def read_check(body: Any, rules: RuleSet, where: str = "the body") -> Check:
    """``{"rule": ..., "key": ..., "cost": 1}``."""
    obj = _object(body, where, _CHECK_FIELDS, ("rule", "key"))
    return Check(_rule(obj["rule"], where, rules), _key(obj["key"], where), _cost(obj.get("cost", 1), where))


def read_checks(body: Any, rules: RuleSet) -> list[Check] | Check:
    """One check, or ``{"checks": [...]}``: a list of 1 to ``MAX_CHECKS`` checks."""
    if isinstance(body, dict) and "checks" in body:
        obj = _object(body, "the body", ("checks",), ("checks",))
        items = obj["checks"]
        accepted = f"an array of 1 to {MAX_CHECKS} objects with 'rule', 'key' and 'cost' (optional)"
        if not isinstance(items, list):
            raise BadInput(400, f"checks must be an array, got {type_name(items)}", accepted)
        if not 1 <= len(items) <= MAX_CHECKS:
            raise BadInput(400, f"checks holds {len(items)} items", accepted)
        return [read_check(item, rules, f"checks[{i}]") for i, item in enumerate(items)]
    return read_check(body, rules)


def read_refund(body: Any, rules: RuleSet) -> tuple[Check, str | None]:
    """``{"rule": ..., "key": ..., "cost": 1, "lease_id": null}``."""
    obj = _object(body, "the body", (*_CHECK_FIELDS, "lease_id"), ("rule", "key"))
    lease = obj.get("lease_id")
    accepted = f"the lease_id of a decision (1 to {MAX_LEASE_ID} characters), or null"
    if lease is not None and not isinstance(lease, str):
        raise BadInput(400, f"lease_id must be a string, got {type_name(lease)}", accepted)
    if lease is not None and not 1 <= len(lease) <= MAX_LEASE_ID:
        raise BadInput(400, f"lease_id is {len(lease)} characters long", accepted)
    check = Check(
        _rule(obj["rule"], "the body", rules), _key(obj["key"], "the body"), _cost(obj.get("cost", 1), "the body")
    )
    return check, lease


def read_reset(body: Any, rules: RuleSet) -> Check:
    """``{"rule": ..., "key": ...}``."""
    obj = _object(body, "the body", ("rule", "key"), ("rule", "key"))
    return Check(_rule(obj["rule"], "the body", rules), _key(obj["key"], "the body"), 0)
