"""Envoy's rate-limit service (gRPC, with Envoy's own messages) and its JSON form (POST /json)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import grpc
import httpx
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2

from .clients import OK, OVER_LIMIT, SERVING, descriptor, envoy_request, health, should_rate_limit
from .conftest import Served, start_server

D = f"e{uuid.uuid4().hex[:8]}"
ENVOY = f"""
domain: {D}
descriptors:
  - key: wide
    rate_limit: {{unit: minute, requests_per_unit: 5}}
  - key: narrow
    rate_limit: {{unit: minute, requests_per_unit: 1}}
  - key: watched
    shadow_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 1}}
  - key: free
    rate_limit: {{unlimited: true}}
  - key: odd
    rate_limit: {{limits: ["3/10s"]}}
"""
SERVICE = "envoy.service.ratelimit.v3.RateLimitService"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = start_server(tmp_path_factory.mktemp("envoy"), rules=[ENVOY])
    yield server
    assert 0 == server.stop()


def k() -> str:
    return uuid.uuid4().hex[:12]


def test_a_refusal_still_charges_the_other_descriptors_as_envoy_does(served: Served) -> None:
    user = k()
    assert OK == should_rate_limit(served.grpc_target, envoy_request(D, [descriptor(("narrow", user))])).overall_code
    pair = [descriptor(("wide", user)), descriptor(("narrow", user))]
    both = should_rate_limit(served.grpc_target, envoy_request(D, pair))
    assert OVER_LIMIT == both.overall_code
    assert [OK, OVER_LIMIT] == [s.code for s in both.statuses]
    # "wide" was charged by the refused request (Envoy's default charging): a look
    # (hits_addend 0) sees 5 - 1 left
    look = should_rate_limit(served.grpc_target, envoy_request(D, [descriptor(("wide", user), hits=0)]))
    assert OK == look.overall_code
    assert 4 == look.statuses[0].limit_remaining
    again = should_rate_limit(served.grpc_target, envoy_request(D, [descriptor(("wide", user), hits=0)]))
    assert 4 == again.statuses[0].limit_remaining  # a look charges nothing


def test_statuses_carry_the_limit_the_remaining_and_the_reset(served: Served) -> None:
    user = k()
    reply = should_rate_limit(served.grpc_target, envoy_request(D, [descriptor(("wide", user))], hits=3))
    status = reply.statuses[0]
    assert OK == status.code
    assert 5 == status.current_limit.requests_per_unit
    assert rls_pb2.RateLimitResponse.RateLimit.MINUTE == status.current_limit.unit
    assert "" == status.current_limit.name  # the YAML gives the limit no name
    assert 2 == status.limit_remaining
    assert 0 < status.duration_until_reset.ToMicroseconds() <= 60_000_000
    headers = {h.key: h.value for h in reply.response_headers_to_add}
    assert f'"{D}.wide";q=5;w=60' == headers["RateLimit-Policy"]
    assert "2" == headers["X-RateLimit-Remaining"]
    over = should_rate_limit(served.grpc_target, envoy_request(D, [descriptor(("wide", user), hits=3)]))
    assert OVER_LIMIT == over.overall_code
    assert "Retry-After" in {h.key for h in over.response_headers_to_add}


def test_a_period_that_is_no_envoy_unit_is_reported_as_unknown(served: Served) -> None:
    reply = should_rate_limit(served.grpc_target, envoy_request(D, [descriptor(("odd", k()))]))
    assert rls_pb2.RateLimitResponse.RateLimit.UNKNOWN == reply.statuses[0].current_limit.unit
    assert 3 == reply.statuses[0].current_limit.requests_per_unit


def test_shadow_unlimited_unmatched_and_unknown_domains_are_ok(served: Served) -> None:
    user = k()
    for _ in range(3):
        three = [descriptor(("watched", user)), descriptor(("free", user)), descriptor(("nothing", user))]
        reply = should_rate_limit(served.grpc_target, envoy_request(D, three))
        assert OK == reply.overall_code
        assert [OK, OK, OK] == [s.code for s in reply.statuses]
    assert reply.statuses[0].HasField("current_limit")  # shadow: decided, reported, never refused
    assert not reply.statuses[1].HasField("current_limit")
    assert not reply.statuses[2].HasField("current_limit")
    elsewhere = should_rate_limit(served.grpc_target, envoy_request("no-such-domain", [descriptor(("wide", user))]))
    assert OK == elsewhere.overall_code


def test_a_limit_override_in_the_request_applies(served: Served) -> None:
    user = k()
    d = descriptor(("wide", user))
    d.limit.CopyFrom(
        ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(
            requests_per_unit=2, unit=rls_pb2.RateLimitResponse.RateLimit.HOUR
        )
    )
    codes = [should_rate_limit(served.grpc_target, envoy_request(D, [d])).overall_code for _ in range(3)]
    assert [OK, OK, OVER_LIMIT] == codes


@pytest.mark.parametrize(
    ("request_", "word"),
    [
        (envoy_request("", [descriptor(("wide", "x"))]), "no domain"),
        (envoy_request(D, []), "0 descriptors"),
        (envoy_request(D, [descriptor(("", "x"))]), "without a key"),
    ],
    ids=["no-domain", "no-descriptors", "empty-key"],
)
def test_bad_requests_are_invalid_argument(served: Served, request_: object, word: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        should_rate_limit(served.grpc_target, request_)
    assert grpc.StatusCode.INVALID_ARGUMENT == info.value.code()  # type: ignore[attr-defined]
    assert word in info.value.details()  # type: ignore[attr-defined]


def test_the_json_form_answers_like_grpc(served: Served) -> None:
    user = k()
    body = {"domain": D, "descriptors": [{"entries": [{"key": "narrow", "value": user}]}]}
    with httpx.Client(base_url=served.url, timeout=10) as client:
        first = client.post("/json", json=body)
        second = client.post("/json", json=body)
    assert 200 == first.status_code
    assert "OK" == first.json()["overallCode"]
    limit = first.json()["statuses"][0]["currentLimit"]
    assert {"requestsPerUnit": 1, "unit": "MINUTE"} == limit  # no name in the YAML, none answered
    assert 429 == second.status_code
    assert "OVER_LIMIT" == second.json()["overallCode"]
    assert "OVER_LIMIT" == second.json()["statuses"][0]["code"]
    # the JSON and the gRPC form share one state
    third = should_rate_limit(served.grpc_target, envoy_request(D, [descriptor(("narrow", user))]))
    assert OVER_LIMIT == third.overall_code


def test_grpc_health_serves_while_the_store_answers(served: Served) -> None:
    assert SERVING == health(served.grpc_target)
    assert SERVING == health(served.grpc_target, SERVICE)
