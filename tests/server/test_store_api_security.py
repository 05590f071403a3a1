"""What a client of ``POST /v1/store`` (the service as a store) can and cannot do, against
the real ``ratekeeper serve`` on the memory store, Redis and PostgreSQL: its rules live in
a namespace of their own (no lockout of a configured rule's keys, however large the burst,
cost or wait it sends), every field is within the bounds the stores decide exactly (a 400
naming the field and its bound otherwise), and the rules it makes the service build are
bounded, least recently used evicted first, with the evictions in the metrics."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratekeeper import Limiter, Rule
from ratekeeper.errors import ConfigurationError, StoreError
from ratekeeper.stores.service.options import ServiceOptions
from ratekeeper.stores.service.protocol import MAX_PLANS, PlanCache

from .conftest import REDIS_URL, Served

POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture
def store_url(request: pytest.FixtureRequest, uid: str) -> Iterator[str]:
    """The store URL of one parametrized kind, private to this test, cleaned up after it."""
    kind = request.param
    if kind == "memory":
        yield "memory://"
    elif kind == "redis":
        prefix = f"rk-test-{uid}:"
        yield f"{REDIS_URL}?prefix={prefix}"
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    else:
        schema = f"rk_store_api_{uid}"
        yield f"{POSTGRES_URL}?schema={schema}&timeout=10"  # the first call installs the schema
        import psycopg

        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def configured(uid: str) -> str:
    return f"""
rules:
  - name: {uid}.items.list
    limits: ["100/minute"]
    algorithm: gcra
  - name: {uid}.tight
    limits: ["1/minute"]
    algorithm: gcra
"""


def store_call(served: Served, rules: list[Any], ops: list[Any], atomic: bool = False) -> httpx.Response:
    body = {"now": None, "atomic": atomic, "rules": rules, "ops": ops}
    return httpx.post(f"{served.admin_url}/v1/store", json=body, timeout=10)


def check(served: Served, rule: str, key: str) -> httpx.Response:
    return httpx.post(f"{served.url}/v1/check", json={"rule": rule, "key": key}, timeout=10)


@pytest.mark.parametrize("store_url", STORES, indirect=True)
def test_a_client_rule_named_like_a_configured_rule_cannot_lock_out_its_keys(
    serve: Callable[..., Served], uid: str, store_url: str
) -> None:
    """The issue's request: the configured rule's name and rate with a burst of 10**10 and
    a cost as large, then reservations with the longest wait. On the configured rule's
    state it meant a refusal for about 190 years; the store API's rules are its own."""
    served = serve(rules=[configured(uid)], store=store_url, args=["--store-api"])
    name = f"{uid}.items.list"
    spec = [name, "gcra", [[100, 60_000_000, 10**10]]]
    takeover = store_call(served, [spec], [["d", 0, "victim", 10**10, None, None]])
    assert 200 == takeover.status_code, takeover.text
    assert takeover.json()["results"][0][0] is True  # admitted: in the store API's namespace
    for _ in range(3):  # a schema-valid reservation, repeated: it extends nothing configured
        reply = store_call(served, [spec], [["d", 0, "victim", 10**10, 2**62, None]])
        assert 200 == reply.status_code, reply.text
    answer = check(served, name, "victim")
    assert 200 == answer.status_code, answer.text
    assert 99 == answer.json()["remaining"]
    # and the client's own state is still there for the client (one namespace, one state)
    again = store_call(served, [spec], [["p", 0, "victim", 1, None, None]])
    assert again.json()["results"][0][0] is False


@pytest.mark.parametrize("store_url", STORES, indirect=True)
def test_a_client_reset_or_refund_under_a_configured_name_gives_back_nothing_configured(
    serve: Callable[..., Served], uid: str, store_url: str
) -> None:
    served = serve(rules=[configured(uid)], store=store_url, args=["--store-api"])
    name = f"{uid}.tight"
    assert 200 == check(served, name, "k").status_code
    assert 429 == check(served, name, "k").status_code
    spec = [name, "gcra", [[1, 60_000_000, None]]]
    reply = store_call(served, [spec], [["x", 0, "k", 0, None, None], ["r", 0, "k", 1, None, None]])
    assert 200 == reply.status_code, reply.text
    assert 429 == check(served, name, "k").status_code


BOUNDS: list[tuple[str, list[Any], list[Any], str, str]] = [
    # (id, rule spec, op, words of the detail, the bound in the accepted form)
    ("cost-2**63", ["r", "gcra", [[1, 1_000_000, None]]], ["d", 0, "k", 2**63, None, None], "(cost)", "2**50"),
    ("cost-2**50+1", ["r", "gcra", [[1, 1_000_000, None]]], ["d", 0, "k", 2**50 + 1, None, None], "(cost)", "2**50"),
    ("wait-2**63", ["r", "gcra", [[1, 1_000_000, None]]], ["d", 0, "k", 1, 2**63, None], "(max_wait)", "2**62"),
    ("count", ["r", "gcra", [[2**50 + 1, 1_000_000, None]]], ["d", 0, "k", 1, None, None], "(count)", str(2**50)),
    ("burst", ["r", "gcra", [[1, 1_000_000, 2**50 + 1]]], ["d", 0, "k", 1, None, None], "(burst)", str(2**50)),
    ("period", ["r", "gcra", [[1, 10 * 366 * 86_400_000_000 + 1, None]]], ["d", 0, "k", 1, None, None],
     "(period_us)", "ten years"),
    ("key", ["r", "gcra", [[1, 1_000_000, None]]], ["d", 0, "k" * 513, 1, None, None], "(key)", "512"),
    ("lease", ["r", "concurrency", [[1, 1_000_000, None]]], ["r", 0, "k", 1, None, "l" * 129], "(lease_id)", "128"),
    ("name", ["r" * 257, "gcra", [[1, 1_000_000, None]]], ["d", 0, "k", 1, None, None], "(name)", "256"),
    ("algorithm", ["r", "nope", [[1, 1_000_000, None]]], ["d", 0, "k", 1, None, None], "(algorithm)", "gcra"),
    ("rule-index", ["r", "gcra", [[1, 1_000_000, None]]], ["d", 1, "k", 1, None, None], "rule_index", "1 rules"),
    ("too-fine", ["r", "token_bucket", [[1, 10**13, 10**6]]], ["d", 0, "k", 1, None, None], "too fine", "2**53"),
    ("release-without-lease", ["r", "concurrency", [[1, 1_000_000, None]]], ["r", 0, "k", 1, None, None],
     "lease_id", "lease_id"),
]  # fmt: skip


def test_every_field_out_of_the_stores_bounds_is_a_400_naming_it(serve: Callable[..., Served], uid: str) -> None:
    served = serve(args=["--store-api"])
    for case, spec, op, words, bound in BOUNDS:
        reply = store_call(served, [spec], [op])
        assert 400 == reply.status_code, (case, reply.text)
        problem = reply.json()
        assert words in problem["detail"], (case, problem)
        assert bound in problem["detail"] + problem["accepted"], (case, problem)
    # a period written as a float with no fraction is the integer JSON Schema says it is
    reply = store_call(served, [[f"{uid}.r", "gcra", [[1, 68887232.0, None]]]], [["d", 0, "k", 1.0, None, None]])
    assert 200 == reply.status_code, reply.text
    assert reply.json()["results"][0][0] is True


@pytest.mark.postgres
def test_an_op_past_bigint_never_reaches_a_statement_shared_with_other_checks(
    serve: Callable[..., Served], uid: str, request: pytest.FixtureRequest
) -> None:
    """The issue's run: store calls with a cost of 2**63 among other clients' checks on
    PostgreSQL made 29 of those checks answer 503. Each such call is a 400 at the door now,
    and every check is decided."""
    schema = f"rk_store_api_{uid}"
    request.addfinalizer(lambda: _drop_schema(schema))
    served = serve(rules=[configured(uid)], store=f"{POSTGRES_URL}?schema={schema}&timeout=10", args=["--store-api"])
    name = f"{uid}.items.list"
    poison = [[name, "gcra", [[100, 60_000_000, None]]]]
    start = threading.Barrier(16)
    checks: list[int] = []
    refusals: list[int] = []

    def legit(i: int) -> None:
        start.wait()
        with httpx.Client(timeout=10) as client:
            for _ in range(10):
                checks.append(client.post(f"{served.url}/v1/check", json={"rule": name, "key": f"c{i}"}).status_code)

    def poisoner() -> None:
        start.wait()
        with httpx.Client(timeout=10) as client:
            for _ in range(10):
                body = {"rules": poison, "ops": [["d", 0, "c0", 2**63, None, None], ["d", 0, "c1", 1, 2**63, None]]}
                refusals.append(client.post(f"{served.admin_url}/v1/store", json=body).status_code)

    threads = [threading.Thread(target=legit, args=(i,)) for i in range(8)]
    threads += [threading.Thread(target=poisoner) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [200] * 80 == checks
    assert [400] * 80 == refusals


DAY_US = 86_400_000_000


def test_the_rules_clients_make_the_service_build_are_bounded_and_evictions_counted(
    serve: Callable[..., Served], uid: str
) -> None:
    served = serve(args=["--store-api"])
    # a day's fixed window: the first call and the peek at the end never straddle a
    # window's edge (a minute's did, now and then, on a slow run)
    per_call = 256
    calls = MAX_PLANS // per_call + 2
    for c in range(calls):
        rules = [[f"{uid}.{c}.{i}", "fixed_window", [[5, DAY_US, None]]] for i in range(per_call)]
        reply = store_call(served, rules, [["d", 0, "k", 1, None, None]])
        assert 200 == reply.status_code, reply.text
    metrics = httpx.get(f"{served.admin_url}/metrics", timeout=10).text
    built = calls * per_call
    assert f'ratekeeper_bounded_cache_bound{{cache="store_api_rules"}} {float(MAX_PLANS)}' in metrics
    assert f'ratekeeper_bounded_cache_entries{{cache="store_api_rules"}} {float(MAX_PLANS)}' in metrics
    assert f'ratekeeper_bounded_cache_evictions_total{{cache="store_api_rules"}} {float(built - MAX_PLANS)}' in metrics
    # an evicted rule keeps its state: built again, it finds the same storage key
    again = store_call(served, [[f"{uid}.0.0", "fixed_window", [[5, DAY_US, None]]]], [["p", 0, "k", 0, None, None]])
    assert [4] == again.json()["results"][0][4]


def test_the_plan_cache_evicts_the_least_recently_used_rule_and_rebuilds_it_alike() -> None:
    plans = PlanCache(bound=2)
    a = plans.plan(["a", "gcra", [[1, 1_000_000, None]]], "store-api")
    b = plans.plan(["b", "gcra", [[1, 1_000_000, None]]], "store-api")
    assert a is plans.plan(["a", "gcra", [[1, 1_000_000, None]]], "store-api")  # a is now the most recent
    plans.plan(["c", "gcra", [[1, 1_000_000, None]]], "store-api")
    assert 1 == plans.cache.evictions
    assert a is plans.plan(["a", "gcra", [[1, 1_000_000, None]]], "store-api")
    rebuilt = plans.plan(["b", "gcra", [[1, 1_000_000, None]]], "store-api")
    assert rebuilt is not b and rebuilt.table == b.table
    assert 2 == len(plans.cache)


def test_a_store_api_rule_never_has_a_configured_rules_or_another_tokens_storage_identity() -> None:
    plans = PlanCache()
    spec = ["items.list", "gcra", [[100, 60_000_000, None]]]
    tables = {
        Rule("items.list", ["100/minute"], algorithm="gcra").plan.table,
        plans.plan(spec, "store-api").table,
        plans.plan(spec, "store-api/fleet-a").table,
        plans.plan(spec, "store-api/fleet-b").table,
    }
    assert 4 == len(tables)
    # a rule name holding the namespace's separator cannot reach another namespace
    assert (
        plans.plan(["fleet-a:x", "gcra", [[1, 1_000_000, None]]], "store-api").name
        != plans.plan(["x", "gcra", [[1, 1_000_000, None]]], "store-api/fleet-a").name
    )


def test_the_service_store_takes_its_token_from_the_environment(
    serve: Callable[..., Served], uid: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cret-" + uid
    tokens = tmp_path / "admin.tokens"
    tokens.write_text(f"fleet:{secret}\n")
    served = serve(args=["--store-api", "--admin-token-file", str(tokens)])
    monkeypatch.setenv("RATEKEEPER_SERVICE_TOKEN", secret)
    with Limiter(served.admin_url) as limiter:
        assert limiter.try_acquire(Rule(f"{uid}.r", ["1/minute"]), "k").allowed
    monkeypatch.setenv("RATEKEEPER_SERVICE_TOKEN", "wrong")
    with Limiter(served.admin_url) as limiter, pytest.raises(StoreError, match="token_file"):
        limiter.try_acquire(Rule(f"{uid}.r", ["1/minute"]), "k")


@pytest.mark.parametrize(
    ("content", "words"),
    [(None, "cannot be read"), ("", "holds no secret"), ("# only a comment\n", "holds no secret"),
     ("two words\n", "without spaces")],
)  # fmt: skip
def test_a_token_file_that_holds_no_usable_secret_is_a_configuration_error(
    tmp_path: Path, content: str | None, words: str
) -> None:
    path = tmp_path / "secret"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigurationError, match=words):
        ServiceOptions(f"http://127.0.0.1:1/?token_file={path}", {}, environ={})


def test_a_token_file_wins_over_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("# the fleet's secret\nfrom-file\n")
    options = ServiceOptions(
        "http://127.0.0.1:1/", {"token_file": str(path)}, environ={"RATEKEEPER_SERVICE_TOKEN": "x"}
    )
    assert "Bearer from-file" == options.headers["authorization"]
    assert "authorization" not in ServiceOptions("http://127.0.0.1:1/", {}, environ={}).headers


def _drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
