"""The partner scenario over both transports, on the memory store, Redis and PostgreSQL: ten
concurrent checks of one key at 1/3s admit exactly one, and the refusals charge nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from .clients import OK, OVER_LIMIT, descriptor, envoy_request, many_grpc, many_http
from .conftest import REDIS_URL, Served

POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
STORES = [
    pytest.param("memory://", id="memory"),
    pytest.param(REDIS_URL, id="redis", marks=pytest.mark.redis),
    pytest.param(POSTGRES_URL, id="postgres", marks=pytest.mark.postgres),
]


def rules_for(uid: str) -> list[str]:
    native = f"""
rules:
  - name: {uid}.partner_api
    limits: ["1/3s"]
    algorithm: gcra
"""
    envoy = f"""
domain: {uid}
descriptors:
  - key: partner
    rate_limit: {{limits: ["1/3s"], algorithm: gcra}}
"""
    return [native, envoy]


@pytest.mark.parametrize("store", STORES)
def test_ten_concurrent_checks_at_1_per_3s_admit_exactly_one(
    serve: Callable[..., Served], uid: str, store: str, request: pytest.FixtureRequest
) -> None:
    if store == POSTGRES_URL:  # a schema of this test's own, dropped at the end
        schema = f"rk_partner_{uid}"
        request.addfinalizer(lambda: _drop_schema(schema))
        store = f"{POSTGRES_URL}?schema={schema}&timeout=10"  # the first call installs the schema
    served = serve(rules=rules_for(uid), store=store)

    bodies = [{"rule": f"{uid}.partner_api", "key": "alice", "cost": 1}] * 10
    http = asyncio.run(many_http(served.url, "/v1/check", bodies))
    assert [200] == [r.status_code for r in http if r.status_code == 200]
    assert 9 == sum(r.status_code == 429 for r in http)
    refused = next(r for r in http if r.status_code == 429)
    assert refused.json()["allowed"] is False
    assert 1 <= int(refused.headers["Retry-After"]) <= 3
    assert f'"{uid}.partner_api";q=1;w=3' == refused.headers["RateLimit-Policy"]

    requests = [envoy_request(uid, [descriptor(("partner", "alice"))])] * 10
    grpc_answers = asyncio.run(many_grpc(served.grpc_target, requests))
    codes = [a.overall_code for a in grpc_answers]
    assert 1 == codes.count(OK)
    assert 9 == codes.count(OVER_LIMIT)
    admitted = grpc_answers[codes.index(OK)]
    assert 1 == admitted.statuses[0].current_limit.requests_per_unit
    assert 0 == admitted.statuses[0].limit_remaining

    # another key is a bucket of its own, on both transports
    other = asyncio.run(many_http(served.url, "/v1/check", [{"rule": f"{uid}.partner_api", "key": "bob"}]))
    assert 200 == other[0].status_code
    assert served.stop() == 0


def _drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
