"""The OpenAPI document is the contract: each surface's ``/openapi.json`` describes that
surface's routes only, and for every body, the document (validated by jsonschema-rs, an
implementation of JSON Schema that is not ours) and the running service agree on whether
it is acceptable. The bodies include the disagreements the issue found."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema_rs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper.server.openapi import openapi_document
from ratekeeper.server.problems import BadInput
from ratekeeper.server.schema import _SLOW, _Checker, _fast, request_schemas

from .conftest import Served

DECISION_PATHS = {"/v1/check", "/v1/peek", "/json", "/healthz", "/readyz", "/openapi.json"}
ADMIN_PATHS = {"/v1/reset", "/v1/refund", "/v1/rules", "/metrics", "/healthz", "/openapi.json"}


def test_each_surface_has_a_document_of_its_own_routes() -> None:
    assert DECISION_PATHS == set(openapi_document(surface="decision")["paths"])
    assert ADMIN_PATHS | {"/v1/store"} == set(openapi_document(surface="admin")["paths"])
    assert ADMIN_PATHS == set(openapi_document(surface="admin", store_api=False)["paths"])
    decision = openapi_document(["r"], surface="decision")
    assert {"Check", "Checks", "EnvoyRequest"} <= set(decision["components"]["schemas"])
    assert not {"Refund", "Reset", "StoreCall"} & set(decision["components"]["schemas"])
    with pytest.raises(ValueError, match="surface is one of"):
        openapi_document(surface="public")


def rules(uid: str) -> str:
    return f"""
rules:
  - name: {uid}.plain
    limits: ["100/minute"]
  - name: {uid}.conc
    limits: ["3/minute"]
    algorithm: concurrency
"""


def body_schema(doc: dict[str, Any], path: str) -> jsonschema_rs.Draft202012Validator:
    schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema_rs.Draft202012Validator({**doc, **schema})


def cases(uid: str) -> list[tuple[str, str, Any]]:
    """(surface, path, body): each either valid by the document and accepted, or neither."""
    plain, conc = f"{uid}.plain", f"{uid}.conc"
    rule = [f"{uid}.s", "gcra", [[1, 68_887_232, None]]]
    one = [["d", 0, "k", 1, None, None]]
    return [
        ("decision", "/v1/check", {"rule": plain, "key": "a", "cost": 2.0}),
        ("decision", "/v1/check", {"rule": plain, "key": "a", "cost": 1.5}),
        ("decision", "/v1/check", {"rule": plain, "key": "a", "cost": 2**32}),
        ("decision", "/v1/check", {"rule": plain, "key": "k" * 512}),
        ("decision", "/v1/check", {"rule": plain, "key": "k" * 513}),
        ("decision", "/v1/check", {"rule": "nope", "key": "a"}),
        ("decision", "/v1/check", {"checks": [{"rule": plain, "key": "a"}, {"rule": conc, "key": "b"}]}),
        ("decision", "/v1/peek", {"rule": plain, "key": "a", "cost": 0}),
        ("admin", "/v1/refund", {"rule": plain, "key": "a", "lease_id": "x"}),  # the issue's: refused, and now
        ("admin", "/v1/refund", {"rule": plain, "key": "a", "lease_id": None}),  # the document says so
        ("admin", "/v1/refund", {"rule": conc, "key": "a"}),  # a release needs its lease
        ("admin", "/v1/refund", {"rule": conc, "key": "a", "lease_id": "not-held"}),
        ("admin", "/v1/refund", {"rule": conc, "key": "a", "lease_id": "nul\x00"}),
        ("admin", "/v1/reset", {"rule": plain, "key": "a"}),
        ("admin", "/v1/reset", {"rule": plain, "key": "a", "cost": 1}),
        # the issue's: a period written 68887232.0 is an integer to JSON Schema, and to the service
        ("admin", "/v1/store", {"rules": [[rule[0], "gcra", [[1, 68887232.0, None]]]], "ops": one}),
        ("admin", "/v1/store", {"rules": [rule], "ops": [["d", 0, "k", 2**63, None, None]]}),
        ("admin", "/v1/store", {"rules": [rule], "ops": [["d", 0, "k", 1, 2**63, None]]}),
        ("admin", "/v1/store", {"rules": [[rule[0], "gcra", [[1, 1_000_000, 2**51]]]], "ops": one}),
        ("admin", "/v1/store", {"rules": [rule], "ops": [["d", 0, "k", 1, None, None]], "now": 5}),
        ("admin", "/v1/store", {"rules": [rule], "ops": [["d", 0, "k", 1, None, None]], "atomic": True}),
    ]  # fmt: skip


def test_the_document_and_the_service_agree_on_every_body(serve: Callable[..., Served], uid: str) -> None:
    served = serve(rules=[rules(uid)], args=["--store-api"])
    urls = {"decision": served.url, "admin": served.admin_url}
    docs = {name: httpx.get(f"{url}/openapi.json", timeout=5).json() for name, url in urls.items()}
    assert DECISION_PATHS == set(docs["decision"]["paths"])
    assert ADMIN_PATHS | {"/v1/store"} == set(docs["admin"]["paths"])
    disagreements = []
    for surface, path, body in cases(uid):
        valid = body_schema(docs[surface], path).is_valid(body)
        status = httpx.post(f"{urls[surface]}{path}", json=body, timeout=5).status_code
        if (status in (200, 429)) != valid or (not valid and status != 400):
            disagreements.append((path, body, "valid" if valid else "invalid", status))
    assert [] == disagreements


def test_what_the_store_schema_cannot_say_its_description_says(serve: Callable[..., Served], uid: str) -> None:
    """An op's rule_index must name one of the call's rules: no JSON Schema can say it, so
    the document says it in words and the service refuses such a call with a 400."""
    served = serve(args=["--store-api"])
    doc = httpx.get(f"{served.admin_url}/openapi.json", timeout=5).json()
    op = doc["components"]["schemas"]["StoreCall"]["properties"]["ops"]["items"]
    assert "rule_index names one of the call's rules" in op["description"]
    body = {"rules": [[f"{uid}.s", "gcra", [[1, 1_000_000, None]]]], "ops": [["d", 1, "k", 1, None, None]]}
    assert body_schema(doc, "/v1/store").is_valid(body)
    reply = httpx.post(f"{served.admin_url}/v1/store", json=body, timeout=5)
    assert 400 == reply.status_code
    assert "rule_index names one of the call's 1 rules" in reply.json()["detail"]


# -- the compiled checks decide as the schema interpreter does -----------------------------

SCHEMAS = request_schemas(["a", "b", "c"], ["c"], explicit_now=True)
BASES: list[tuple[str, Any]] = [
    ("Check", {"rule": "a", "key": "k", "cost": 1}),
    ("Checks", {"checks": [{"rule": "a", "key": "k"}, {"rule": "b", "key": "k", "cost": 0}]}),
    ("Refund", {"rule": "c", "key": "k", "lease_id": "l"}),
    ("Reset", {"rule": "a", "key": "k"}),
    ("StoreCall", {"now": None, "atomic": False, "rules": [["r", "gcra", [[1, 1_000_000, None]]]],
                   "ops": [["d", 0, "k", 1, None, None], ["r", 0, "k", 1, 5, "l"]]}),
]  # fmt: skip
TRICKY = st.one_of(
    st.sampled_from([2**63, 2**62, 2**62 + 1, 2**50, 2**50 + 1, 2**32, -1, 0, 1.0, 1.5, 1e300, True, None, "",
                     "k" * 513, "x\x00", "gcra", "d", "a", "c", [], {}, [1, 1_000_000, None]]),
    st.integers(),
    st.text(max_size=4),
)  # fmt: skip


def _containers(value: Any) -> list[Any]:
    found = [value] if isinstance(value, dict | list) else []
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    for child in children:
        found += _containers(child)
    return found


@pytest.mark.slow  # 400 hypothesis bodies
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_the_compiled_checks_pass_only_what_the_schema_interpreter_passes(data: st.DataObject) -> None:
    name, base = data.draw(st.sampled_from(BASES))
    body = copy.deepcopy(base)
    for _ in range(data.draw(st.integers(0, 3))):
        containers = _containers(body)  # drawn by index: equal containers are still distinct
        target = containers[data.draw(st.integers(0, len(containers) - 1))]
        if isinstance(target, dict):
            keys = list(dict.fromkeys([*target, "extra"]))
            key = keys[data.draw(st.integers(0, len(keys) - 1))]
            if data.draw(st.booleans()) and key in target:
                del target[key]
            else:
                target[key] = copy.deepcopy(data.draw(TRICKY))
        elif target and data.draw(st.booleans()):
            target[data.draw(st.integers(0, len(target) - 1))] = copy.deepcopy(data.draw(TRICKY))
        else:
            target.append(copy.deepcopy(data.draw(TRICKY)))  # the pool's lists are shared objects
    fast = _fast(SCHEMAS, name)(body)
    try:
        slow = _Checker(SCHEMAS).check(SCHEMAS[name], body, "the body")
    except BadInput:
        assert fast is _SLOW
        return
    assert fast is _SLOW or fast == slow
    if body == base and name != "Refund":  # the common bodies take the compiled path
        assert fast is not _SLOW
