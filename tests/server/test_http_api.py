"""The JSON API of ``ratekeeper serve`` through a real HTTP client against the real server
(``client``: the decision surface; ``admin``: the admin surface)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Served, start_server

U = f"h{uuid.uuid4().hex[:8]}"
RULES = f"""
rules:
  - name: {U}.one
    limits: ["1/minute"]
    algorithm: fixed_window
  - name: {U}.five
    limits: ["5/minute"]
  - name: {U}.two
    limits: ["20/minute", "2/3s"]
    algorithm: sliding_window_log
  - name: {U}.shadow
    limits: ["1/minute"]
    shadow: true
  - name: {U}.conc
    limits: ["1/minute"]
    algorithm: concurrency
  - name: {U}.fast
    limits: ["10/100ms"]
  - name: {U}.ten
    limits: ["10/minute"]
    algorithm: fixed_window
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = start_server(tmp_path_factory.mktemp("http"), rules=[RULES])
    yield server
    assert 0 == server.stop()


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
def admin(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.admin_url, timeout=10) as c:
        yield c


def key() -> str:
    return uuid.uuid4().hex


def check(client: httpx.Client, body: Any) -> httpx.Response:
    return client.post("/v1/check", json=body)


def test_check_admits_then_refuses_with_the_decision_and_the_headers(client: httpx.Client) -> None:
    k = key()
    first = check(client, {"rule": f"{U}.one", "key": k})
    assert 200 == first.status_code
    assert "application/json" == first.headers["content-type"]
    body = first.json()
    assert {"rule": f"{U}.one", "allowed": True, "remaining": 0, "denied_by": None} == {
        f: body[f] for f in ("rule", "allowed", "remaining", "denied_by")
    }
    assert [{"limit": "1/minute", "remaining": 0, "denied": False}] == [
        {f: s[f] for f in ("limit", "remaining", "denied")} for s in body["limits"]
    ]
    assert f'"{U}.one";q=1;w=60' == first.headers["RateLimit-Policy"]
    assert "1" == first.headers["X-RateLimit-Limit"]
    assert "0" == first.headers["X-RateLimit-Remaining"]
    assert "Retry-After" not in first.headers

    second = check(client, {"rule": f"{U}.one", "key": k, "cost": 1})
    assert 429 == second.status_code
    assert second.json()["allowed"] is False
    assert "1/minute" == second.json()["denied_by"]
    assert 1 <= int(second.headers["Retry-After"]) <= 60


def test_a_batch_is_all_or_nothing(client: httpx.Client) -> None:
    k = key()
    assert 200 == check(client, {"rule": f"{U}.one", "key": k}).status_code  # uses up .one for k
    batch = check(client, {"checks": [{"rule": f"{U}.five", "key": k}, {"rule": f"{U}.one", "key": k}]})
    assert 429 == batch.status_code
    doc = batch.json()
    assert doc["allowed"] is False
    assert [True, False] == [d["allowed"] for d in doc["decisions"]]
    # .five was not charged by the refused batch: still 5 left
    peek = client.post("/v1/peek", json={"rule": f"{U}.five", "key": k, "cost": 0})
    assert 200 == peek.status_code
    assert 5 == peek.json()["remaining"]
    ok = check(client, {"checks": [{"rule": f"{U}.five", "key": k, "cost": 2}, {"rule": f"{U}.two", "key": k}]})
    assert 200 == ok.status_code
    assert [3, 1] == [d["remaining"] for d in ok.json()["decisions"]]


def test_refund_and_reset_give_back_what_was_charged(client: httpx.Client, admin: httpx.Client) -> None:
    k = key()
    assert 200 == check(client, {"rule": f"{U}.five", "key": k, "cost": 5}).status_code
    assert 429 == check(client, {"rule": f"{U}.five", "key": k}).status_code
    refund = admin.post("/v1/refund", json={"rule": f"{U}.five", "key": k, "cost": 2})
    assert {"rule": f"{U}.five", "key": k, "refunded": 2} == refund.json()
    assert 2 == client.post("/v1/peek", json={"rule": f"{U}.five", "key": k, "cost": 0}).json()["remaining"]
    reset = admin.post("/v1/reset", json={"rule": f"{U}.five", "key": k})
    assert reset.json()["reset"] is True
    assert 5 == client.post("/v1/peek", json={"rule": f"{U}.five", "key": k, "cost": 0}).json()["remaining"]


def test_a_concurrency_lease_is_released_by_refund(client: httpx.Client, admin: httpx.Client) -> None:
    k = key()
    held = check(client, {"rule": f"{U}.conc", "key": k})
    assert 200 == held.status_code
    lease = held.json()["lease_id"]
    assert 429 == check(client, {"rule": f"{U}.conc", "key": k}).status_code
    released = admin.post("/v1/refund", json={"rule": f"{U}.conc", "key": k, "cost": 1, "lease_id": lease})
    assert 200 == released.status_code
    assert 200 == check(client, {"rule": f"{U}.conc", "key": k}).status_code


def test_a_shadow_rule_never_refuses_and_sends_no_headers(client: httpx.Client) -> None:
    k = key()
    check(client, {"rule": f"{U}.shadow", "key": k})
    again = check(client, {"rule": f"{U}.shadow", "key": k})
    assert 200 == again.status_code
    body = again.json()
    assert (True, True, True) == (body["allowed"], body["shadow"], body["would_deny"])
    assert "RateLimit" not in again.headers


def test_rules_health_ready_and_openapi(client: httpx.Client, admin: httpx.Client) -> None:
    rules = admin.get("/v1/rules").json()
    names = [r["name"] for r in rules["rules"]]
    assert [f"{U}.one", f"{U}.five", f"{U}.two", f"{U}.shadow", f"{U}.conc", f"{U}.fast", f"{U}.ten"] == names
    assert ["20/minute", "2/3s"] == rules["rules"][2]["limits"]
    assert {"status": "ok"} == client.get("/healthz").json()
    assert {"status": "ready"} == client.get("/readyz").json()
    doc = client.get("/openapi.json").json()
    assert "3.1.0" == doc["openapi"]
    # each surface describes its own routes
    assert {"/v1/check", "/v1/peek", "/json", "/healthz", "/readyz", "/openapi.json"} == set(doc["paths"])
    admin_paths = set(admin.get("/openapi.json").json()["paths"])
    assert {"/v1/refund", "/v1/reset", "/v1/rules", "/metrics", "/healthz", "/openapi.json"} == admin_paths
    assert names == doc["components"]["schemas"]["Check"]["properties"]["rule"]["enum"]
    head = client.head("/healthz")
    assert 200 == head.status_code
    assert b"" == head.content


def test_metrics_count_decisions_per_rule_and_requests(client: httpx.Client, admin: httpx.Client) -> None:
    k = key()
    check(client, {"rule": f"{U}.one", "key": k})
    check(client, {"rule": f"{U}.one", "key": k})
    reply = admin.get("/metrics")
    assert 200 == reply.status_code
    assert reply.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }
    over = samples[("ratekeeper_decisions_total", (("outcome", "over"), ("rule", f"{U}.one")))]
    assert over >= 1
    assert samples[("ratekeeper_requests_total", (("transport", "http"),))] >= 2
    assert k not in reply.text


BAD: list[tuple[str, str, dict[str, str], bytes | str, int, str]] = [
    # (id, path, headers, body, status, a word of the detail)
    ("malformed", "/v1/check", {}, b'{"rule": ', 400, "malformed JSON"),
    ("not-utf8", "/v1/check", {}, b'{"rule": "\xff"}', 400, "UTF-8"),
    ("nan", "/v1/check", {}, b'{"rule": "x", "key": "k", "cost": NaN}', 400, "NaN"),
    ("array", "/v1/check", {}, b"[1, 2]", 400, "must be a JSON object"),
    ("empty", "/v1/check", {}, b"", 400, "empty"),
    ("unknown-rule", "/v1/check", {}, '{"rule": "nope", "key": "k"}', 400, "unknown rule"),
    ("rule-type", "/v1/check", {}, '{"rule": 7, "key": "k"}', 400, "rule must be a string"),
    ("key-type", "/v1/check", {}, '{"rule": "@one", "key": 7}', 400, "key must be a string"),
    ("key-empty", "/v1/check", {}, '{"rule": "@one", "key": ""}', 400, "key is empty"),
    ("key-long", "/v1/check", {}, '{"rule": "@one", "key": "' + "k" * 513 + '"}', 400, "513 characters"),
    ("cost-float", "/v1/check", {}, '{"rule": "@one", "key": "k", "cost": 1.5}', 400, "cost must be an integer"),
    ("cost-string", "/v1/check", {}, '{"rule": "@one", "key": "k", "cost": "1"}', 400, "cost must be an integer"),
    ("cost-bool", "/v1/check", {}, '{"rule": "@one", "key": "k", "cost": true}', 400, "cost must be an integer"),
    ("cost-negative", "/v1/check", {}, '{"rule": "@one", "key": "k", "cost": -1}', 400, "out of range"),
    ("cost-huge", "/v1/check", {}, '{"rule": "@one", "key": "k", "cost": 99999999999999999999}', 400, "out of range"),
    ("extra-field", "/v1/check", {}, '{"rule": "@one", "key": "k", "weight": 1}', 400, "unknown field"),
    ("missing-key", "/v1/check", {}, '{"rule": "@one"}', 400, "lacks the field 'key'"),
    ("checks-empty", "/v1/check", {}, '{"checks": []}', 400, "holds 0 items"),
    ("checks-type", "/v1/check", {}, '{"checks": {}}', 400, "checks must be an array"),
    ("checks-item", "/v1/check", {}, '{"checks": [{"rule": "@one", "key": "k"}, 3]}', 400, "checks[1]"),
    ("deep", "/v1/check", {}, "[" * 50_000 + "]" * 50_000, 413, "larger than"),
    ("nested", "/v1/check", {}, "[" * 20_000 + "]" * 20_000, 400, "malformed JSON"),
    ("big", "/v1/check", {}, '{"rule": "@one", "key": "' + "k" * 70_000 + '"}', 413, "larger than 65536"),
    ("text-plain", "/v1/check", {"content-type": "text/plain"}, '{"rule": "@one", "key": "k"}', 415, "text/plain"),
    ("form", "/v1/check", {"content-type": "application/x-www-form-urlencoded"}, "rule=x", 415, "must be JSON"),
    ("no-content-type", "/v1/check", {"content-type": ""}, '{"rule": "@one", "key": "k"}', 415, "Content-Type"),
    ("unknown-route", "/v2/check", {}, "{}", 404, "no route"),
    ("lease-not-concurrency", "/v1/refund", {}, '{"rule": "@one", "key": "k", "lease_id": "x"}', 400, "no leases"),
    ("reset-cost", "/v1/reset", {}, '{"rule": "@one", "key": "k", "cost": 1}', 400, "unknown field"),
    ("envoy-no-domain", "/json", {}, '{"descriptors": [{"entries": [{"key": "a"}]}]}', 400, "no domain"),
    ("envoy-bad-field", "/json", {}, '{"domain": "d", "descriptors": 5}', 400, "RateLimitRequest"),
    ("envoy-no-descriptors", "/json", {}, '{"domain": "d"}', 400, "0 descriptors"),
]


@pytest.mark.parametrize(("path", "headers", "body", "status", "word"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_gets_a_4xx_problem_and_charges_nothing(
    client: httpx.Client,
    admin: httpx.Client,
    path: str,
    headers: dict[str, str],
    body: bytes | str,
    status: int,
    word: str,
) -> None:
    k = key()
    raw = body.replace("@one", f"{U}.one").replace('"k"', f'"{k}"') if isinstance(body, str) else body
    surface = admin if path in ("/v1/refund", "/v1/reset") else client
    reply = surface.post(path, content=raw, headers={"content-type": "application/json", **headers})
    assert status == reply.status_code, reply.text
    assert "application/problem+json" == reply.headers["content-type"]
    problem = reply.json()
    assert status == problem["status"]
    assert word in problem["detail"]
    assert problem["title"]
    if status != 404:
        assert problem["accepted"]
    # nothing was charged to the key named in the bad request
    assert 1 == client.post("/v1/peek", json={"rule": f"{U}.one", "key": k, "cost": 0}).json()["remaining"]


def test_a_wrong_method_is_405_with_allow(client: httpx.Client, admin: httpx.Client) -> None:
    reply = client.get("/v1/check")
    assert 405 == reply.status_code
    assert "POST" == reply.headers["Allow"]
    assert "application/problem+json" == reply.headers["content-type"]
    put = admin.put("/metrics", content=b"x")
    assert 405 == put.status_code
    assert "GET, HEAD" == put.headers["Allow"]


def test_a_chunked_body_over_the_limit_is_refused(client: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(80):
            yield b" " * 1024

    reply = client.post("/v1/check", content=chunks(), headers={"content-type": "application/json"})
    assert 413 == reply.status_code
    assert "application/problem+json" == reply.headers["content-type"]


# -- what a client is told is true (issue 17, section 3): the one headers function ---------


def _sf_list(value: str) -> dict[str, dict[str, Any]]:
    import http_sf

    return {n: dict(p) for n, p in http_sf.parse(value.encode(), tltype="list")}  # type: ignore[misc]


def test_a_sub_second_limit_is_advertised_at_its_real_rate(client: httpx.Client) -> None:
    r = check(client, {"rule": f"{U}.fast", "key": key()})
    assert 200 == r.status_code
    assert {f"{U}.fast": {"q": 100, "w": 1}} == _sf_list(r.headers["RateLimit-Policy"])


def test_a_cost_that_never_fits_is_not_told_to_retry_now(client: httpx.Client) -> None:
    r = check(client, {"rule": f"{U}.ten", "key": key(), "cost": 20})
    assert 429 == r.status_code
    state = _sf_list(r.headers["RateLimit"])[f"{U}.ten"]
    assert 0 == state["r"] and 1 <= state["t"] <= 60
    assert "0" == r.headers["X-RateLimit-Remaining"]
    assert 1 <= int(r.headers["X-RateLimit-Reset"]) <= 60
    assert "Retry-After" not in r.headers


def test_a_concurrency_rule_is_not_advertised_as_a_rate(client: httpx.Client) -> None:
    r = check(client, {"checks": [{"rule": f"{U}.conc", "key": key()}, {"rule": f"{U}.five", "key": key()}]})
    assert 200 == r.status_code
    assert [f"{U}.five"] == list(_sf_list(r.headers["RateLimit-Policy"]))
    assert "5" == r.headers["X-RateLimit-Limit"]
