"""``POST /v1/refund`` through the real service, on every store: a refund says what it gave
back, and a lease can only be released by the key that holds it."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable

import httpx
import pytest

from .conftest import REDIS_URL, Served
from .test_partner import POSTGRES_URL, _drop_schema

STORES = [
    pytest.param("memory://", id="memory"),
    pytest.param(REDIS_URL, id="redis", marks=pytest.mark.redis),
    pytest.param(POSTGRES_URL, id="postgres", marks=pytest.mark.postgres),
]


@pytest.mark.parametrize("store", STORES)
def test_a_lease_named_under_another_key_refunds_nothing_and_frees_nothing(
    serve: Callable[..., Served], store: str, request: pytest.FixtureRequest
) -> None:
    uid = f"r{uuid.uuid4().hex[:10]}"
    if store == POSTGRES_URL:
        schema = f"rk_refund_{uid}"
        request.addfinalizer(lambda: _drop_schema(schema))
        # The first call installs the schema's functions: on a loaded machine that can take
        # longer than the default 1 s store timeout.
        store = f"{POSTGRES_URL}?schema={schema}&timeout=10"
    rules = f"""
rules:
  - name: {uid}.conc
    limits: ["1/minute"]
    algorithm: concurrency
"""
    served = serve(rules=[rules], store=store)
    rule = f"{uid}.conc"
    with (
        httpx.Client(base_url=served.url, timeout=10) as client,
        httpx.Client(base_url=served.admin_url, timeout=10) as admin,
    ):
        held = client.post("/v1/check", json={"rule": rule, "key": "alice"})
        assert 200 == held.status_code
        lease = held.json()["lease_id"]
        assert 200 == client.post("/v1/check", json={"rule": rule, "key": "bob"}).status_code

        # bob names alice's lease: nothing is given back, alice still holds her one slot
        stolen = admin.post("/v1/refund", json={"rule": rule, "key": "bob", "cost": 1, "lease_id": lease})
        assert {"rule": rule, "key": "bob", "refunded": 0} == stolen.json()
        assert 429 == client.post("/v1/check", json={"rule": rule, "key": "alice"}).status_code
        assert 429 == client.post("/v1/check", json={"rule": rule, "key": "bob"}).status_code

        # alice releases her own lease: given back, once
        mine = admin.post("/v1/refund", json={"rule": rule, "key": "alice", "cost": 1, "lease_id": lease})
        assert {"rule": rule, "key": "alice", "refunded": 1} == mine.json()
        again = admin.post("/v1/refund", json={"rule": rule, "key": "alice", "cost": 1, "lease_id": lease})
        assert {"rule": rule, "key": "alice", "refunded": 0} == again.json()
        assert 200 == client.post("/v1/check", json={"rule": rule, "key": "alice"}).status_code
    assert 0 == served.stop()


def test_lease_ids_carry_no_counter(serve: Callable[..., Served]) -> None:
    uid = f"r{uuid.uuid4().hex[:10]}"
    rules = f"""
rules:
  - name: {uid}.conc
    limits: ["100/minute"]
    algorithm: concurrency
"""
    served = serve(rules=[rules])
    with httpx.Client(base_url=served.url, timeout=10) as client:
        ids = [client.post("/v1/check", json={"rule": f"{uid}.conc", "key": "k"}).json()["lease_id"] for _ in range(20)]
    assert len(set(ids)) == 20
    # 128 random bits each: no two share a long common prefix or suffix (a counter would)
    for a, b in itertools.pairwise(ids):
        assert a[:8] != b[:8] and a[-8:] != b[-8:]
        assert len(a) >= 22
    assert 0 == served.stop()
