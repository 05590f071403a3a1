"""The OpenAPI 3.1 document of the JSON API (``GET /openapi.json``), one per surface.

The request bodies' schemas are the ones the handlers check each body against
(``schema.py``), so the document says exactly what is accepted: a tool that follows it
(schemathesis in the tests) gets 2xx/429 answers, and one that breaks it gets a 4xx
problem. Where a schema cannot say a rule (an op's rule_index names one of the call's
rules), the field's description does.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from ratekeeper.server.inputs import MAX_BODY
from ratekeeper.server.schema import REF, request_schemas
from ratekeeper.server.surfaces import STORE_PATH, surface_paths

__all__ = ["openapi_document"]

_REF = REF


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

_SCHEMAS: dict[str, Any] = {
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


_STORE_RESULTS: dict[str, Any] = {
    "type": "object",
    "properties": {"results": {"type": "array", "items": {"type": ["array", "object", "boolean", "null"]}}},
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


def openapi_document(
    rules: Sequence[str] = (),
    domains: Sequence[str] = (),
    surface: str | None = None,
    *,
    leased: Sequence[str] = (),
    store_api: bool = True,
    explicit_now: bool = False,
) -> dict[str, Any]:
    """The document of one surface (``surface``: ``"decision"`` or ``"admin"``; None: every
    route), a fresh dict each call. ``rules`` (the names of the rules in force) become the
    ``enum`` of every ``rule`` field, ``leased`` (the concurrency rules among them) the
    rules whose refund names a lease, ``domains`` the examples of Envoy's ``domain``;
    ``store_api``: whether the admin surface serves ``/v1/store``, ``explicit_now``
    whether that takes a ``now`` (a service started for tests)."""
    wanted = set(surface_paths(surface, store_api)) if surface is not None else None
    schemas = copy.deepcopy(_SCHEMAS)
    schemas.update(request_schemas(rules, leased, domains, explicit_now))
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
            _ref("StoreCall"),
            {
                "200": _json(_STORE_RESULTS, "One result per op: a decision, a refund's result, null, or a failure"),
                "504": _problem("The store timed out on an atomic call"),
            },
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
    if wanted is None:
        wanted = set(paths) if store_api else set(paths) - {STORE_PATH}
    paths = {path: item for path, item in paths.items() if path in wanted}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ratekeeper",
            "version": _version(),
            "description": "Rate-limit decisions over HTTP (ratekeeper serve). Envoy's gRPC service runs beside it.",
        },
        "paths": paths,
        "components": {"schemas": _used(paths, schemas)},
    }


def _used(paths: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    """The schemas ``paths`` refer to, directly or through another schema."""
    used: set[str] = set()
    todo: list[Any] = [paths]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(_REF) and ref[len(_REF) :] not in used:
                used.add(ref[len(_REF) :])
                todo.append(schemas[ref[len(_REF) :]])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return {name: schema for name, schema in schemas.items() if name in used}
