"""What clients can make the real service create stays bounded: a flood of distinct Envoy
``limit`` overrides keeps the override rules at their bound (their state forgotten with
them), ``/metrics`` small and without a client-chosen label, and the process's memory
within a stated bound; an override with an undefined unit is a bad request, not a 500."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from prometheus_client.parser import text_string_to_metric_families

from ratekeeper.server.envoy import MAX_DESCRIPTORS, MAX_OVERRIDE_RULES

from .clients import OK, OVER_LIMIT, descriptor, envoy_request, many_grpc, should_rate_limit
from .conftest import Served, start_server

D = f"b{uuid.uuid4().hex[:8]}"
ENVOY = f"""
domain: {D}
descriptors:
  - key: user
    rate_limit: {{unit: minute, requests_per_unit: 5}}
"""
NATIVE = """
rules:
  - name: api
    limits: ["1000/hour"]
    algorithm: sliding_window_log
"""
HOUR = rls_pb2.RateLimitResponse.RateLimit.HOUR
DISTINCT = 40_000
"""Distinct override sizes in the flood (the issue's service slowed for good at 45,000 rules)."""
RSS_GROWTH_MB = 40
"""What the flood may add to the service's resident memory: the kept override rules and
their tables and the allocator's slack (measured: 6 MB); without a bound the flood added
hundreds of MB (the issue: 240 MB for 10,240 rules)."""
METRICS_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = start_server(tmp_path_factory.mktemp("bounded"), rules=[ENVOY, NATIVE])
    yield server
    assert 0 == server.stop()


def overridden(user: str, requests: int, unit: int = HOUR) -> ratelimit_pb2.RateLimitDescriptor:
    d = descriptor(("user", user))
    d.limit.CopyFrom(ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(requests_per_unit=requests, unit=unit))
    return d


def rss_mb(served: Served) -> float:
    for line in Path(f"/proc/{served.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/<pid>/status")


def metrics(served: Served) -> tuple[bytes, dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    body = httpx.get(f"{served.admin_url}/metrics", timeout=10).content
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return body, samples


def cache_value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str) -> float:
    return samples[(f"ratekeeper_bounded_cache_{name}", frozenset({("cache", "envoy_overrides")}))]


async def flood(target: str, first: int) -> None:
    """``DISTINCT`` distinct override sizes from ``first`` on, ``MAX_DESCRIPTORS`` a request."""
    requests = [
        envoy_request(D, [overridden(f"f{n}", n) for n in range(start, start + MAX_DESCRIPTORS)])
        for start in range(first, first + DISTINCT, MAX_DESCRIPTORS)
    ]
    for at in range(0, len(requests), 50):
        replies = await many_grpc(target, requests[at : at + 50])
        assert all(r.overall_code == OK for r in replies)


def test_a_flood_of_distinct_overrides_keeps_rules_metrics_and_memory_bounded(served: Served) -> None:
    user = uuid.uuid4().hex[:8]
    # an override in use before the flood: exact while kept (two requests share one counter)
    kept = [should_rate_limit(served.grpc_target, envoy_request(D, [overridden(user, 3)])) for _ in range(2)]
    assert [OK, OK] == [r.overall_code for r in kept]
    with httpx.Client(base_url=served.url, timeout=10) as client:
        assert 200 == client.post("/v1/check", json={"rule": "api", "key": user}).status_code
    before = rss_mb(served)

    asyncio.run(flood(served.grpc_target, first=10))

    body, samples = metrics(served)
    assert cache_value(samples, "entries") == MAX_OVERRIDE_RULES
    assert cache_value(samples, "bound") == MAX_OVERRIDE_RULES
    assert cache_value(samples, "evictions_total") >= DISTINCT - MAX_OVERRIDE_RULES
    rules = {dict(labels).get("rule") for _, labels in samples} - {None}
    assert rules <= {"api", f"{D}.user", "_other"}, "a client-chosen name became a label"
    other = samples[("ratekeeper_decisions_total", frozenset({("rule", "_other"), ("outcome", "within")}))]
    assert other >= DISTINCT
    assert len(body) < METRICS_BYTES
    grown = rss_mb(served) - before
    assert grown < RSS_GROWTH_MB, f"the flood grew the service by {grown:.0f} MB"

    # the configured rules answer as before, with their state intact
    with httpx.Client(base_url=served.url, timeout=10) as client:
        check = client.post("/v1/check", json={"rule": "api", "key": user})
    assert 200 == check.status_code
    assert 998 == check.json()["remaining"]
    # the override used before the flood was evicted: it starts again from zero...
    again = [should_rate_limit(served.grpc_target, envoy_request(D, [overridden(user, 3)])) for _ in range(4)]
    assert [OK, OK, OK, OVER_LIMIT] == [r.overall_code for r in again]
    # ...and two requests with the same override still share one counter
    assert 0 == again[2].statuses[0].limit_remaining


def test_a_flood_leaves_the_memory_store_holding_only_the_kept_override_tables(
    tmp_path: Path,
) -> None:
    """The service's own count of tables is not exported; the memory store's is read in a
    process of the same code: one ``Service`` on a real event loop, answering gRPC."""
    from ratekeeper.config.envoy import parse_envoy
    from ratekeeper.limiter.limiter_async import AsyncLimiter
    from ratekeeper.metrics import Metrics
    from ratekeeper.server.catalog import build_catalog
    from ratekeeper.server.envoy import overrides_of
    from ratekeeper.server.envoy import should_rate_limit as answer
    from ratekeeper.server.service import Service, ServiceObserver
    from ratekeeper.stores.memory import MemoryStore

    store = MemoryStore()
    m = Metrics()
    # overrides apply only to a domain the service knows (as in Envoy)
    catalog = build_catalog([("rules.yaml", parse_envoy(ENVOY))])
    service = Service(AsyncLimiter(store, observer=ServiceObserver(m)), m, catalog)

    async def run() -> None:
        for start in range(10, 10 + 8_000, MAX_DESCRIPTORS):
            request = envoy_request(D, [overridden(f"f{n}", n) for n in range(start, start + MAX_DESCRIPTORS)])
            assert (await answer(service, request)).overall_code == OK

    asyncio.run(run())
    assert len(overrides_of(service).cache) == MAX_OVERRIDE_RULES
    assert store.table_count() == MAX_OVERRIDE_RULES  # every evicted rule's table was forgotten


@pytest.mark.parametrize("unit", [99, -1, 0])
def test_an_override_with_an_undefined_unit_is_a_bad_request_on_json(served: Served, unit: int) -> None:
    body = {
        "domain": D,
        "descriptors": [{"entries": [{"key": "user", "value": "u"}], "limit": {"requestsPerUnit": 5, "unit": unit}}],
    }
    reply = httpx.post(f"{served.url}/json", json=body, timeout=10)
    assert 400 == reply.status_code, reply.text
    assert "descriptor 0 overrides the limit" in reply.text
    assert "SECOND (1) to YEAR (6), or 7 (a week)" in reply.text


def test_an_override_with_an_undefined_unit_is_invalid_argument_on_grpc(served: Served) -> None:
    with pytest.raises(grpc.RpcError) as info:
        should_rate_limit(served.grpc_target, envoy_request(D, [overridden("u", 5, unit=99)]))
    assert grpc.StatusCode.INVALID_ARGUMENT == info.value.code()  # type: ignore[attr-defined]
    assert "unit 99" in info.value.details()  # type: ignore[attr-defined]


def test_a_refused_request_makes_no_override_rule(served: Served) -> None:
    _, samples = metrics(served)
    evictions = cache_value(samples, "evictions_total") if samples else 0.0
    entries = cache_value(samples, "entries")
    fresh = 7_000_000 + uuid.uuid4().int % 1_000_000  # a size no other test uses
    bad = envoy_request(D, [overridden("u", fresh), overridden("u", 5, unit=99)])
    with pytest.raises(grpc.RpcError):
        should_rate_limit(served.grpc_target, bad)
    _, samples = metrics(served)
    assert (entries, evictions) == (cache_value(samples, "entries"), cache_value(samples, "evictions_total"))
