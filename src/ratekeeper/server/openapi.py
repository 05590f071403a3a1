"""The OpenAPI 3.1 document of the JSON API (``GET /openapi.json``).

Written by hand from the same constants the handlers check (``inputs.py``), so the
schemas say exactly what is accepted: a tool that follows them (schemathesis in the
tests) gets 2xx/429 answers, and one that breaks them gets a 4xx problem.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.rule import MAX_KEY_LENGTH
from ratekeeper.server.envoy import MAX_DESCRIPTORS
from ratekeeper.server.inputs import MAX_BODY, MAX_CHECKS, MAX_COST, MAX_LEASE_ID

__all__ = ["openapi_document"]

_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _json(schema: dict[str, Any], description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        out["headers"] = headers
    return out


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/problem+json": {"schema": _ref("Problem")}}}


_PROBLEMS = {
    "400": _problem("The body is not acceptable (malformed JSON, a wrong field, an unknown rule)"),
    "413": _problem(f"The body is larger than {MAX_BODY} bytes"),
    "415": _problem("The body is not JSON (Content-Type must be application/json)"),
}

_LIMIT_HEADERS = {
    "RateLimit-Policy": {"description": "draft-ietf-httpapi-ratelimit-headers-11", "schema": {"type": "string"}},
    "RateLimit": {"description": "draft-ietf-httpapi-ratelimit-headers-11", "schema": {"type": "string"}},
    "X-RateLimit-Limit": {"schema": {"type": "string"}},
    "X-RateLimit-Remaining": {"schema": {"type": "string"}},
    "X-RateLimit-Reset": {"description": "seconds", "schema": {"type": "string"}},
}
_RETRY = {"Retry-After": {"description": "whole seconds, rounded up", "schema": {"type": "string"}}}

_STORE_DOWN = _problem("The store failed and the failure policy is 'raise'")

# The proto3 JSON mapping accepts null for the default and the proto field name beside its
# JSON name: the schema says so too.
_HITS = {
    "type": ["integer", "null"],
    "minimum": 0,
    "maximum": MAX_COST,
    "description": "hits to add (0, null or absent: 1)",
}
_DESCRIPTOR_HITS = {**_HITS, "description": "hits for this descriptor; 0 checks without charging"}

_SCHEMAS: dict[str, Any] = {
    "Check": {
        "type": "object",
        "properties": {
            "rule": {"type": "string", "description": "the name of a rule of the rules file (GET /v1/rules)"},
            "key": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH},
            "cost": {"type": "integer", "minimum": 0, "maximum": MAX_COST, "default": 1},
        },
        "required": ["rule", "key"],
        "additionalProperties": False,
    },
    "Checks": {
        "type": "object",
        "properties": {"checks": {"type": "array", "items": _ref("Check"), "minItems": 1, "maxItems": MAX_CHECKS}},
        "required": ["checks"],
        "additionalProperties": False,
    },
    "Refund": {
        "type": "object",
        "properties": {
            "rule": {"type": "string"},
            "key": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH},
            "cost": {"type": "integer", "minimum": 0, "maximum": MAX_COST, "default": 1},
            "lease_id": {
                "type": ["string", "null"],
                "minLength": 1,
                "maxLength": MAX_LEASE_ID,
                "description": "a concurrency rule's lease to release",
            },
        },
        "required": ["rule", "key"],
        "additionalProperties": False,
    },
    "Reset": {
        "type": "object",
        "properties": {
            "rule": {"type": "string"},
            "key": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH},
        },
        "required": ["rule", "key"],
        "additionalProperties": False,
    },
    "LimitStats": {
        "type": "object",
        "properties": {
            "limit": {"type": "string", "examples": ["5/3s"]},
            "remaining": {"type": "integer"},
            "reset_after": {"type": "number"},
            "denied": {"type": "boolean"},
        },
        "required": ["limit", "remaining", "reset_after", "denied"],
    },
    "Decision": {
        "type": "object",
        "properties": {
            "rule": {"type": "string"},
            "allowed": {"type": "boolean"},
            "remaining": {"type": "integer"},
            "retry_after": {"type": ["number", "null"], "description": "seconds; null: never (cost > capacity)"},
            "reset_after": {"type": "number"},
            "delay": {"type": "number"},
            "denied_by": {"type": ["string", "null"]},
            "limits": {"type": "array", "items": _ref("LimitStats")},
            "lease_id": {"type": "string"},
            "fallback": {"type": "string", "enum": ["allow", "deny", "local"]},
            "shadow": {"type": "boolean"},
            "would_deny": {"type": "boolean"},
        },
        "required": ["rule", "allowed", "remaining", "retry_after", "reset_after", "limits"],
    },
    "BatchDecision": {
        "type": "object",
        "properties": {"allowed": {"type": "boolean"}, "decisions": {"type": "array", "items": _ref("Decision")}},
        "required": ["allowed", "decisions"],
    },
    "Problem": {
        "type": "object",
        "description": "RFC 9457 problem details",
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "accepted": {"type": "string", "description": "what the service accepts instead"},
        },
        "required": ["type", "title", "status", "detail"],
    },
    "Rules": {
        "type": "object",
        "properties": {
            "sources": {"type": "array", "items": {"type": "string"}},
            "rules": {"type": "array", "items": {"type": "object"}},
            "envoy_domains": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["sources", "rules", "envoy_domains"],
    },
    "EnvoyRequest": {
        "type": "object",
        "description": "envoy.service.ratelimit.v3.RateLimitRequest in the proto3 JSON mapping",
        "properties": {
            "domain": {"type": "string", "minLength": 1},
            "descriptors": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_DESCRIPTORS,
                "items": {
                    "type": "object",
                    "properties": {
                        "entries": {
                            "type": "array",
                            "minItems": 1,
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
                        "hitsAddend": _DESCRIPTOR_HITS,
                        "hits_addend": _DESCRIPTOR_HITS,
                    },
                    "required": ["entries"],
                    "additionalProperties": False,
                },
            },
            "hitsAddend": _HITS,
            "hits_addend": _HITS,
        },
        "required": ["domain", "descriptors"],
        "additionalProperties": False,
    },
    "EnvoyResponse": {
        "type": "object",
        "description": "envoy.service.ratelimit.v3.RateLimitResponse in the proto3 JSON mapping",
        "properties": {
            "overallCode": {"type": "string", "enum": ["OK", "OVER_LIMIT"]},
            "statuses": {"type": "array", "items": {"type": "object"}},
            "responseHeadersToAdd": {"type": "array", "items": {"type": "object"}},
        },
        "required": ["overallCode", "statuses"],
    },
}


_NULLABLE_INT = {"type": ["integer", "null"], "minimum": 0}
_STORE_CALL: dict[str, Any] = {
    "type": "object",
    "description": "ratekeeper.stores.service.sansio: the rule travels with the call",
    "additionalProperties": False,
    "required": ["rules", "ops"],
    "properties": {
        "now": {"type": "null", "description": "the store's clock (a service started for tests also accepts µs)"},
        "atomic": {"type": "boolean", "description": "true: every op charged or none (DECIDE ops only)"},
        "rules": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "array",
                "description": "[name, algorithm, [[count, period_us, burst | null], ...]]",
                "prefixItems": [
                    {"type": "string", "minLength": 1},
                    {"type": "string", "enum": sorted(ALGORITHMS)},
                    {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "array",
                            "prefixItems": [
                                {"type": "integer", "minimum": 1, "maximum": 1_000_000},
                                {"type": "integer", "minimum": 1, "maximum": 86_400_000_000},
                                {"type": ["integer", "null"], "minimum": 1, "maximum": 1_000_000},
                            ],
                            "minItems": 3,
                            "maxItems": 3,
                        },
                    },
                ],
                "minItems": 3,
                "maxItems": 3,
            },
        },
        "ops": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "array",
                "description": "[mode (d, p, r, x), rule_index, key, cost, max_wait | null, lease_id | null]",
                "prefixItems": [
                    {"type": "string", "enum": ["d", "p", "r", "x"]},
                    {"type": "integer", "minimum": 0, "maximum": 0},
                    {"type": "string", "minLength": 1, "maxLength": 512},
                    {"type": "integer", "minimum": 0},
                    _NULLABLE_INT,
                    {"type": ["string", "null"]},
                ],
                "minItems": 6,
                "maxItems": 6,
            },
        },
    },
}
_STORE_RESULTS: dict[str, Any] = {
    "type": "object",
    "properties": {"results": {"type": "array", "items": {"type": ["array", "object", "null"]}}},
    "required": ["results"],
}


def _post(summary: str, schema: dict[str, Any], responses: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {**responses, **_PROBLEMS, "503": _STORE_DOWN},
        }
    }


def _get(summary: str, responses: dict[str, Any]) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": responses}}


def _version() -> str:
    try:
        return metadata.version("ratekeeper")
    except metadata.PackageNotFoundError:  # running from a checkout that is not installed
        return "0+unknown"


def openapi_document(rules: Sequence[str] = (), domains: Sequence[str] = ()) -> dict[str, Any]:
    """The whole document, a fresh dict each call. ``rules`` (the names of the rules in
    force) become the ``enum`` of every ``rule`` field; ``domains`` the examples of
    Envoy's ``domain``."""
    schemas = copy.deepcopy(_SCHEMAS)
    if rules:
        for name in ("Check", "Refund", "Reset"):
            schemas[name]["properties"]["rule"]["enum"] = list(rules)
    if domains:
        schemas["EnvoyRequest"]["properties"]["domain"]["examples"] = list(domains)
    check_schema = {"oneOf": [_ref("Check"), _ref("Checks")]}
    check_answer = {"oneOf": [_ref("Decision"), _ref("BatchDecision")]}
    paths = {
        "/v1/check": _post(
            "Charge a cost to a key under a rule, or several at once (all or nothing)",
            check_schema,
            {
                "200": _json(check_answer, "Admitted", _LIMIT_HEADERS),
                "429": _json(check_answer, "Refused: nothing was charged", {**_LIMIT_HEADERS, **_RETRY}),
            },
        ),
        "/v1/peek": _post(
            "What /v1/check would answer, without charging", _ref("Check"), {"200": _json(_ref("Decision"), "State")}
        ),
        "/v1/refund": _post(
            "Give back a cost charged earlier (or release a lease)",
            _ref("Refund"),
            {"200": _json({"type": "object"}, "Refunded")},
        ),
        "/v1/reset": _post(
            "Forget everything charged to a key under a rule",
            _ref("Reset"),
            {"200": _json({"type": "object"}, "Reset")},
        ),
        "/v1/rules": _get("The rules in force", {"200": _json(_ref("Rules"), "The rules")}),
        "/healthz": _get("The process answers", {"200": _json({"type": "object"}, "Alive")}),
        "/readyz": _get(
            "The store answers",
            {"200": _json({"type": "object"}, "Ready"), "503": _problem("The store is not reachable")},
        ),
        "/metrics": _get(
            "Prometheus metrics",
            {"200": {"description": "The text exposition", "content": {"text/plain": {"schema": {"type": "string"}}}}},
        ),
        "/openapi.json": _get("This document", {"200": _json({"type": "object"}, "OpenAPI 3.1")}),
        "/v1/store": _post(
            "The service as a store for other limiters (Limiter('http://...')): ops decided in order",
            _STORE_CALL,
            {"200": _json(_STORE_RESULTS, "One result per op: a decision, null, or that op's store failure")},
        ),
        "/json": _post(
            "Envoy's rate-limit request (the gRPC service's JSON form)",
            _ref("EnvoyRequest"),
            {
                "200": _json(_ref("EnvoyResponse"), "OK"),
                "429": _json(_ref("EnvoyResponse"), "OVER_LIMIT: nothing was charged"),
            },
        ),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ratekeeper",
            "version": _version(),
            "description": "Rate-limit decisions over HTTP (ratekeeper serve). Envoy's gRPC service runs beside it.",
        },
        "paths": paths,
        "components": {"schemas": schemas},
    }
