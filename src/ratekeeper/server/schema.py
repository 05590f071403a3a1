"""The inputs of every route, said once: the JSON Schemas that ``/openapi.json`` publishes
and that the service checks each request body against before anything is charged.

A schema here is plain JSON Schema (2020-12, the dialect of OpenAPI 3.1), read by an
interpreter of the part of it these schemas use (``type``, ``enum``, ``minimum``/
``maximum``, ``minLength``/``maxLength``, ``pattern``, ``properties``/``required``/
``additionalProperties``, ``items``/``prefixItems``/``minItems``/``maxItems``, ``allOf``,
``if``/``then``/``else``, ``$ref``), so what the document promises and what the service
accepts cannot drift apart: the bounds below are the ones the stores decide exactly
(``stores/bounds.py``, ``limit.py``). A common body goes through checks compiled once
from the same schema (2 µs a check, 1.6 µs a store op, against 6 and 10 interpreted);
whatever they do not pass goes to the interpreter, which decides it and words the error.

JSON has one number type: ``68887232.0`` is the integer 68887232 (as JSON Schema counts
it), so an integer field takes it and the readers get an ``int``.

What a schema cannot say is said in the ``description`` of the field it concerns and
checked after it by the reader: that an op's ``rule_index`` names one of the call's
rules, that an atomic call holds DECIDE ops only, that a release names the lease of a
concurrency rule, that a bucket's ``capacity x period / count`` stays below 2**53 µs.
Text with a lone surrogate (which no store can encode) is refused when the body is
parsed (``inputs.parse_json``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.limit import MAX_COUNT, MAX_PERIOD_US
from ratekeeper.rule import MAX_KEY_LENGTH
from ratekeeper.server.problems import BadInput
from ratekeeper.stores.bounds import MAX_COST as MAX_STORE_COST
from ratekeeper.stores.bounds import MAX_LEASE_ID_LENGTH, MAX_NOW, MAX_WAIT
from ratekeeper.stores.service.protocol import MAX_OPS, MAX_RULE_NAME, MAX_RULES, RESET

__all__ = [
    "MAX_CHECKS",
    "MAX_COST",
    "MAX_LEASE_ID",
    "REF",
    "check",
    "request_schemas",
    "type_name",
]

REF = "#/components/schemas/"

MAX_COST = 2**32 - 1
"""The largest cost a check may carry (Envoy's ``hits_addend`` is a uint32 too)."""

MAX_CHECKS = 100
"""The most checks one ``{"checks": [...]}`` batch may hold."""

MAX_LEASE_ID = MAX_LEASE_ID_LENGTH
"""The longest ``lease_id`` a refund may name (the limiter's are 32 characters)."""

_LEASE_TEXT = "^[^\\x00]*$"
"""A lease id is text without NUL, which PostgreSQL's text cannot hold. (No text may hold a
lone surrogate, which no store can encode: ``inputs.parse_json`` refuses one in any body.)"""


def _integer(low: int, high: int, title: str, description: str = "", nullable: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"type": ["integer", "null"] if nullable else "integer", "minimum": low, "maximum": high}
    out["title"] = title
    if description:
        out["description"] = description
    return out


def _key(title: str = "key") -> dict[str, Any]:
    return {
        "type": "string",
        "title": title,
        "minLength": 1,
        "maxLength": MAX_KEY_LENGTH,
        "description": "any Unicode text",
    }


def _rule(rules: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "string",
        "title": "rule",
        "description": "the name of a rule of the rules file (GET /v1/rules)",
    }
    if rules:
        out["enum"] = list(rules)
    return out


def _cost() -> dict[str, Any]:
    return {**_integer(0, MAX_COST, "cost"), "default": 1}


def _lease(nullable: bool = True) -> dict[str, Any]:
    return {
        "type": ["string", "null"] if nullable else "string",
        "title": "lease_id",
        "minLength": 1,
        "maxLength": MAX_LEASE_ID,
        "pattern": _LEASE_TEXT,
        "description": "the lease_id of a concurrency rule's decision: the lease to release",
    }


def _object(properties: dict[str, Any], required: Sequence[str], **more: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}
    return {**schema, **more}


def _checks() -> dict[str, Any]:
    return {"type": "array", "title": "checks", "items": {"$ref": REF + "Check"}, "minItems": 1, "maxItems": MAX_CHECKS}


def _refund(rules: Sequence[str], leased: Sequence[str]) -> dict[str, Any]:
    """A release names the lease of a concurrency rule; a refund of any other rule names none."""
    schema = _object({"rule": _rule(rules), "key": _key(), "cost": _cost(), "lease_id": _lease()}, ["rule", "key"])
    if leased:
        schema["allOf"] = [
            {
                "if": {"properties": {"rule": {"enum": list(leased)}}, "required": ["rule"]},
                "then": {
                    "properties": {"lease_id": _lease(False)},
                    "required": ["lease_id"],
                    "description": "a concurrency rule's refund releases a lease: it names the lease_id",
                },
                "else": {"properties": {"lease_id": {"type": "null", "title": "lease_id", "x-leases": False}}},
            }
        ]
    else:
        schema["properties"]["lease_id"] = {"type": "null", "title": "lease_id", "x-leases": False}
    return schema


def _store_rule() -> dict[str, Any]:
    limit = {
        "type": "array",
        "title": "limit",
        "description": "[count, period_us, burst | null]; a bucket's capacity x period / count stays below 2**53 µs",
        "prefixItems": [
            _integer(1, MAX_COUNT, "count"),
            _integer(1, MAX_PERIOD_US, "period_us", "µs, at most ten years"),
            _integer(1, MAX_COUNT, "burst", "token_bucket, gcra and leaky_bucket only", nullable=True),
        ],
        "items": False,
        "minItems": 3,
        "maxItems": 3,
    }
    return {
        "type": "array",
        "title": "rule",
        "description": "[name, algorithm, [[count, period_us, burst | null], ...]]",
        "prefixItems": [
            {"type": "string", "title": "name", "minLength": 1, "maxLength": MAX_RULE_NAME},
            {"type": "string", "title": "algorithm", "enum": sorted(ALGORITHMS)},
            {"type": "array", "title": "limits", "minItems": 1, "maxItems": 16, "items": limit},
        ],
        "items": False,
        "minItems": 3,
        "maxItems": 3,
    }


def _store_call(explicit_now: bool) -> dict[str, Any]:
    now: dict[str, Any] = {"type": "null", "title": "now", "description": "the service's store decides on its clock"}
    if explicit_now:  # a service started for tests (RATEKEEPER_EXPLICIT_NOW=1)
        now = _integer(-MAX_NOW, MAX_NOW, "now", "µs; null: the store's clock", nullable=True)
    op = {
        "type": "array",
        "title": "op",
        "description": (
            "[mode, rule_index, key, cost, max_wait | null, lease_id | null]; rule_index names one of the "
            "call's rules; a release (mode r) of a concurrency rule names its lease_id; a charge without a "
            "check (mode c) has no max_wait and no lease_id"
        ),
        "prefixItems": [
            {"type": "string", "title": "mode", "enum": ["d", "p", "r", "c", RESET]},
            _integer(0, MAX_RULES - 1, "rule_index", "the index of one of the call's rules"),
            _key(),
            _integer(0, MAX_STORE_COST, "cost", "at most 2**50, the largest count a limit may have"),
            _integer(0, MAX_WAIT, "max_wait", "µs, at most 2**62 (as long as it takes)", nullable=True),
            _lease(),
        ],
        "items": False,
        "minItems": 6,
        "maxItems": 6,
    }
    return {
        "type": "object",
        "description": "ratekeeper.stores.service.protocol: the rules travel with the call",
        "properties": {
            "now": now,
            "atomic": {"type": "boolean", "title": "atomic", "description": "true: every op charged or none (d only)"},
            "rules": {"type": "array", "title": "rules", "minItems": 1, "maxItems": MAX_RULES, "items": _store_rule()},
            "ops": {"type": "array", "title": "ops", "minItems": 1, "maxItems": MAX_OPS, "items": op},
        },
        "required": ["rules", "ops"],
        "additionalProperties": False,
    }


# The proto3 JSON mapping accepts null for the default and the proto field name beside its
# JSON name: the schema says so too. (``envoy.py`` reads this body with the proto parser.)
_HITS = {
    "type": ["integer", "null"],
    "minimum": 0,
    "maximum": MAX_COST,
    "description": "hits to add (0, null or absent: 1)",
}
_DESCRIPTOR_HITS = {**_HITS, "description": "hits for this descriptor; 0 checks without charging"}


def _envoy_request() -> dict[str, Any]:
    # Imported here: envoy.py reads its own body (with the proto parser) and imports the
    # inputs' bounds, which import this module.
    from ratekeeper.server.envoy import MAX_DESCRIPTORS

    return _ENVOY_REQUEST | {"properties": {**_ENVOY_REQUEST["properties"], "descriptors": {
        **_ENVOY_REQUEST["properties"]["descriptors"], "maxItems": MAX_DESCRIPTORS}}}  # fmt: skip


# envoy.type.v3.RateLimitUnit has no WEEK; the number 7 is the response's WEEK, and is taken.
_UNITS = ("SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR")
_OVERRIDE_COUNT = {"type": "integer", "minimum": 1, "maximum": 2**32 - 1}
_ENVOY_OVERRIDE: dict[str, Any] = {
    "type": ["object", "null"],  # proto3 JSON: null is an absent message
    "description": "a descriptor's limit override (RateLimitDescriptor.RateLimitOverride): a fixed window "
    "of requests_per_unit per unit, for this request's descriptor",
    "properties": {
        "requestsPerUnit": _OVERRIDE_COUNT,
        "requests_per_unit": _OVERRIDE_COUNT,
        "unit": {"enum": [*_UNITS, *range(1, 8)]},
    },
    "required": ["unit"],
    "oneOf": [
        {"type": "null"},
        {"required": ["requestsPerUnit"], "not": {"required": ["requests_per_unit"]}},
        {"required": ["requests_per_unit"], "not": {"required": ["requestsPerUnit"]}},
    ],
    "additionalProperties": False,
}

_ENVOY_REQUEST: dict[str, Any] = {
    "type": "object",
    "description": "envoy.service.ratelimit.v3.RateLimitRequest in the proto3 JSON mapping",
    "properties": {
        "domain": {"type": "string", "minLength": 1},
        "descriptors": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "entries": {
                        "type": ["array", "null"],  # proto3 JSON: null is an empty list
                        "description": "a descriptor without entries is OK with no limit, as in Envoy",
                        "items": {
                            "type": "object",
                            "properties": {
                                "key": {"type": "string", "minLength": 1},
                                "value": {"type": ["string", "null"]},
                            },
                            "required": ["key"],
                            "additionalProperties": False,
                        },
                    },
                    "limit": _ENVOY_OVERRIDE,
                    "hitsAddend": _DESCRIPTOR_HITS,
                    "hits_addend": _DESCRIPTOR_HITS,
                },
                "additionalProperties": False,
            },
        },
        "hitsAddend": _HITS,
        "hits_addend": _HITS,
    },
    "required": ["domain", "descriptors"],
    "additionalProperties": False,
}


def request_schemas(
    rules: Sequence[str] = (),
    leased: Sequence[str] = (),
    domains: Sequence[str] = (),
    explicit_now: bool = False,
) -> dict[str, dict[str, Any]]:
    """The schemas of the request bodies, by component name (a fresh copy each call).

    ``rules`` (the names of the rules in force) are the ``enum`` of every ``rule`` field,
    ``leased`` the names of the concurrency rules among them (a refund of one names its
    lease), ``domains`` the examples of Envoy's ``domain``; ``explicit_now`` whether the
    store API takes a ``now`` (a service started for tests)."""
    envoy = copy.deepcopy(_envoy_request())
    if domains:
        envoy["properties"]["domain"]["examples"] = list(domains)
    return {
        "Check": _object({"rule": _rule(rules), "key": _key(), "cost": _cost()}, ["rule", "key"]),
        "Checks": _object({"checks": _checks()}, ["checks"]),
        "Refund": _refund(rules, leased),
        "Reset": _object({"rule": _rule(rules), "key": _key()}, ["rule", "key"]),
        "StoreCall": _store_call(explicit_now),
        "EnvoyRequest": envoy,
    }


# -- checking a value against a schema --------------------------------------------------


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


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return type(value) is int
    if kind == "number":
        return type(value) in (int, float)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if kind == "array":
        return isinstance(value, list)
    return isinstance(value, dict)


def _accepted(schema: Mapping[str, Any]) -> str:
    """What a schema accepts, in words (the ``accepted`` of a problem)."""
    kinds = schema.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    words = []
    if "enum" in schema:
        shown = ", ".join(repr(v) for v in schema["enum"][:20]) + (", ..." if len(schema["enum"]) > 20 else "")
        words.append(f"one of {shown}")
    elif "integer" in kinds:
        low, high = schema.get("minimum"), schema.get("maximum")
        words.append(f"an integer from {low} to {high}" if low is not None and high is not None else "an integer")
    elif "string" in kinds:
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        words.append(f"a string of {low} to {high} characters" if high is not None else "a string")
    elif "array" in kinds:
        words.append(f"an array of {schema.get('minItems', 0)} to {schema.get('maxItems', 'any number of')} items")
    elif "object" in kinds:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        words.append("an object with " + ", ".join(f"{f!r}" + ("" if f in required else " (optional)") for f in props))
    else:
        words.extend(f"a {k}" if k != "null" else "" for k in kinds[:1])
    if "null" in kinds and kinds != ["null"]:
        words.append("or null")
    if kinds == ["null"]:
        words = ["null"]
    if schema.get("description"):
        words.append(f"({schema['description']})" if any(words) else schema["description"])
    return " ".join(w for w in words if w)


_KIND_WORDS = {"integer": "an integer", "object": "a JSON object", "array": "an array"}


def _say(where: Any) -> str:
    """The name of a place in the body: ``where`` is the body's name or (parent, "." or "[",
    field or index, title); made into words only for a message, not for every value."""
    if isinstance(where, str):
        return where
    parent, sep, key, title = where
    head = _say(parent)
    if sep == ".":
        return str(key) if head == "the body" else f"{head}.{key}"
    return f"{head}[{key}]" + (f" ({title})" if title else "")


class _Checker:
    def __init__(self, components: Mapping[str, Any]) -> None:
        self.components = components

    def resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        while "$ref" in schema:
            schema = self.components[schema["$ref"].removeprefix(REF)]
        return schema

    def matches(self, schema: Mapping[str, Any], value: Any, where: Any) -> bool:
        try:
            self.check(schema, value, where)
        except BadInput:
            return False
        return True

    def check(self, schema: Mapping[str, Any], value: Any, where: Any) -> Any:
        """``value`` with integral floats made ints, or ``BadInput`` naming ``where``."""
        schema = self.resolve(schema)
        kinds = schema.get("type")
        if kinds is not None:
            kinds = [kinds] if isinstance(kinds, str) else kinds
            if "integer" in kinds and type(value) is float and value.is_integer():
                value = int(value)  # JSON has one number type: 2.0 is the integer 2
            if not any(_is(value, k) for k in kinds):
                if schema.get("x-leases") is False:
                    raise BadInput(
                        400, f"{_say(where)}: the rule holds no leases (it is not a concurrency rule)",
                        "lease_id null or absent; a lease_id only for a concurrency rule",
                    )  # fmt: skip
                words = " or ".join(_KIND_WORDS.get(k, f"a {k}") for k in kinds if k != "null")
                got = f"{type_name(value)} {value!r:.60}" if type_name(value) == "number" else type_name(value)
                raise BadInput(400, f"{_say(where)} must be {words or 'null'}, got {got}", _accepted(schema))
        if "enum" in schema and value not in schema["enum"]:
            title = schema.get("title", "value")
            extra = {"rule": value} if title == "rule" else {}
            raise BadInput(400, f"unknown {title} {value!r:.200} at {_say(where)}", _accepted(schema), **extra)
        if type(value) is int:
            low, high = schema.get("minimum"), schema.get("maximum")
            if (low is not None and value < low) or (high is not None and value > high):
                raise BadInput(400, f"{_say(where)} {value} is out of range", _accepted(schema))
        elif isinstance(value, str):
            self._string(schema, value, where)
        elif isinstance(value, list):
            value = self._array(schema, value, where)
        elif isinstance(value, dict):
            value = self._object(schema, value, where)
        for part in schema.get("allOf", ()):
            value = self.check(part, value, where)
        if "if" in schema:
            branch = schema.get("then") if self.matches(schema["if"], value, where) else schema.get("else")
            if branch is not None:
                value = self.check(branch, value, where)
        return value

    def _string(self, schema: Mapping[str, Any], value: str, where: Any) -> None:
        low, high = schema.get("minLength"), schema.get("maxLength")
        if low and not value:
            raise BadInput(400, f"{_say(where)} is empty", _accepted(schema))
        if (low is not None and len(value) < low) or (high is not None and len(value) > high):
            raise BadInput(400, f"{_say(where)} is {len(value)} characters long", _accepted(schema))
        pattern = schema.get("pattern")
        if pattern is not None and re.search(pattern, value) is None:
            # Each pattern here is one class of the characters allowed: name the first one outside it.
            at = next((i for i, c in enumerate(value) if re.fullmatch(pattern, c) is None), 0)
            raise BadInput(
                400, f"{_say(where)} holds U+{ord(value[at]):04X} at index {at}, which it may not", _accepted(schema)
            )

    def _array(self, schema: Mapping[str, Any], value: list[Any], where: Any) -> list[Any]:
        low, high = schema.get("minItems"), schema.get("maxItems")
        if (low is not None and len(value) < low) or (high is not None and len(value) > high):
            raise BadInput(400, f"{_say(where)} holds {len(value)} items", _accepted(schema))
        prefix = schema.get("prefixItems", ())
        rest = schema.get("items")
        out = list(value)
        for i, item in enumerate(value):
            sub = prefix[i] if i < len(prefix) else rest
            if sub is None:
                continue
            if sub is False:
                raise BadInput(400, f"{_say(where)} holds {len(value)} items", _accepted(schema))
            title = sub.get("title") if i < len(prefix) else None
            out[i] = self.check(sub, item, (where, "[", i, title))
        return out

    def _object(self, schema: Mapping[str, Any], value: dict[str, Any], where: Any) -> dict[str, Any]:
        props: Mapping[str, Any] = schema.get("properties", {})
        if schema.get("additionalProperties") is False:
            unknown = [f for f in value if f not in props]
            if unknown:
                raise BadInput(400, f"unknown field {unknown[0]!r:.100} in {_say(where)}", _accepted(schema))
        missing = [f for f in schema.get("required", ()) if f not in value]
        if missing:
            raise BadInput(400, f"{_say(where)} lacks the field {missing[0]!r}", _accepted(schema))
        out = dict(value)
        for name, sub in props.items():
            if name in value:
                out[name] = self.check(sub, value[name], (where, ".", name, None))
        return out


_SLOW = object()
"""What a compiled check returns for a value it does not pass: the interpreter (``_Checker``)
then decides it, and words the error."""

Fast = Callable[[Any], Any]


def _compile(schema: Mapping[str, Any], components: Mapping[str, Any]) -> Fast:
    """A function passing what ``schema`` accepts, converted (integral floats made ints),
    and returning ``_SLOW`` for anything else, or for what it does not handle itself
    (``allOf``, ``if``): the common body is checked without walking the schema's dicts."""
    while "$ref" in schema:
        schema = components[schema["$ref"].removeprefix(REF)]
    if "allOf" in schema or "if" in schema:
        return lambda value: _SLOW
    kinds = schema.get("type", ())
    kinds = {kinds} if isinstance(kinds, str) else set(kinds)
    nullable = "null" in kinds
    if kinds <= {"null"}:
        return lambda value: value if value is None else _SLOW
    if "integer" in kinds:
        low, high = schema.get("minimum", -(2**70)), schema.get("maximum", 2**70)

        def integer(value: Any) -> Any:
            if type(value) is not int:
                if type(value) is float and value.is_integer():
                    value = int(value)
                elif value is None and nullable:
                    return None
                else:
                    return _SLOW
            return value if low <= value <= high else _SLOW

        return integer
    if "string" in kinds:
        low, high = schema.get("minLength", 0), schema.get("maxLength", 2**62)
        enum = frozenset(schema["enum"]) if "enum" in schema else None
        pattern = re.compile(schema["pattern"]) if "pattern" in schema else None

        def string(value: Any) -> Any:
            if type(value) is not str:
                return None if value is None and nullable else _SLOW
            if not low <= len(value) <= high or (enum is not None and value not in enum):
                return _SLOW
            return value if pattern is None or pattern.search(value) else _SLOW

        return string
    if "boolean" in kinds:
        return lambda value: value if type(value) is bool or (value is None and nullable) else _SLOW
    if "array" in kinds:
        return _compile_array(schema, components)
    if "object" in kinds:
        return _compile_object(schema, components)
    return lambda value: _SLOW


def _compile_array(schema: Mapping[str, Any], components: Mapping[str, Any]) -> Fast:
    low, high = schema.get("minItems", 0), schema.get("maxItems", 2**62)
    prefix = [_compile(sub, components) for sub in schema.get("prefixItems", ())]
    rest_schema = schema.get("items")
    rest = None if rest_schema in (None, False) else _compile(rest_schema, components)
    n = len(prefix)
    if rest is None and rest_schema is False:
        high = min(high, n)

    def array(value: Any) -> Any:
        if type(value) is not list or not low <= len(value) <= high:
            return _SLOW
        out = []
        for i, item in enumerate(value):
            fast = prefix[i] if i < n else rest
            passed = item if fast is None else fast(item)
            if passed is _SLOW:
                return _SLOW
            out.append(passed)
        return out

    return array


def _compile_object(schema: Mapping[str, Any], components: Mapping[str, Any]) -> Fast:
    props = {name: _compile(sub, components) for name, sub in schema.get("properties", {}).items()}
    required = frozenset(schema.get("required", ()))
    closed = schema.get("additionalProperties") is False

    def obj(value: Any) -> Any:
        if type(value) is not dict or not required <= value.keys():
            return _SLOW
        if closed and not value.keys() <= props.keys():
            return _SLOW
        out = value  # copied only when a field is converted
        for name, item in value.items():
            fast = props.get(name)
            if fast is None:
                continue
            passed = fast(item)
            if passed is not item:
                if passed is _SLOW:
                    return _SLOW
                if out is value:
                    out = dict(value)
                out[name] = passed
        return out

    return obj


_COMPILED: dict[int, tuple[Mapping[str, Any], dict[str, Fast]]] = {}
"""The compiled checks of the schemas in use, by the id of their ``request_schemas``
mapping (kept with it, so the id is never reused while listed); a few mappings live at
once (one per rule set and the store API's), the oldest dropped past eight."""


def _fast(schemas: Mapping[str, Any], name: str) -> Fast:
    entry = _COMPILED.get(id(schemas))
    if entry is None or entry[0] is not schemas:
        if len(_COMPILED) >= 8:
            del _COMPILED[next(iter(_COMPILED))]
        entry = _COMPILED[id(schemas)] = (schemas, {})
    compiled = entry[1]
    fast = compiled.get(name)
    if fast is None:
        fast = compiled[name] = _compile(schemas[name], schemas)
    return fast


def check(schemas: Mapping[str, Any], name: str, value: Any, where: str = "the body") -> Any:
    """``value`` checked against the schema ``schemas[name]`` (``request_schemas``): the
    value with integral floats made ints, or ``BadInput`` (400) naming the field, what it
    got and what the schema accepts."""
    passed = _fast(schemas, name)(value)
    if passed is not _SLOW:
        return passed
    return _Checker(schemas).check(schemas[name], value, where)
