"""Envoy's own service and integration cases (envoyproxy/ratelimit: test/service/ratelimit_test.go,
test/integration/integration_test.go), restated here and run over gRPC with Envoy's messages
against the real ``python -m ratekeeper serve``.

The integration cases load Envoy's own YAML files, kept as they are in ``envoy_cases/``. The
service cases mock the limit lookup there; here each is a small Envoy file giving the same
limits. Where ratekeeper deliberately answers otherwise, the test asserts ratekeeper's answer and
docs/service.md ("Differences from Envoy's service") lists it.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2

from .clients import OK, OVER_LIMIT, descriptor, envoy_request, should_rate_limit
from .conftest import REDIS_URL, Served, start_server

CASES = Path(__file__).parent / "envoy_cases"
Unit = rls_pb2.RateLimitResponse.RateLimit
UNIT_SECONDS = {Unit.SECOND: 1, Unit.MINUTE: 60, Unit.HOUR: 3600, Unit.DAY: 86400}


def envoy_file(name: str) -> str:
    return (CASES / name).read_text()


def ask(served: Served, domain: str, *descriptors: Any, hits: int = 1) -> Any:
    return should_rate_limit(served.grpc_target, envoy_request(domain, list(descriptors), hits=hits))


def status_of(reply: Any, i: int = 0) -> tuple[int, int, int, int, str]:
    """(code, requests_per_unit, unit, limit_remaining, name) of one status."""
    s = reply.statuses[i]
    return (s.code, s.current_limit.requests_per_unit, s.current_limit.unit, s.limit_remaining, s.current_limit.name)


def assert_reset_in_window(reply: Any, i: int, unit: int) -> None:
    """Envoy's duration_until_reset: to the end of the unit's window counted from the epoch."""
    seconds = UNIT_SECONDS[unit]
    got = reply.statuses[i].duration_until_reset.ToMicroseconds() / 1e6
    expected = seconds - time.time() % seconds
    assert 0 < got <= seconds
    assert abs(got - expected) < 1.5 or abs(got - expected) > seconds - 1.5  # a window may turn meanwhile


# --- test/integration/integration_test.go: testBasicBaseConfig, on each store -----------------


@pytest.fixture(scope="module", params=["memory", "redis", "redis-stop"])
def integration(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Envoy's runtime files, served as Envoy's integration suite serves them: on the memory
    store, on Redis, and on Redis with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true."""
    store = None
    env: dict[str, str] = {}
    if request.param.startswith("redis"):
        store = f"{REDIS_URL}?prefix=rk-test-{uuid.uuid4().hex[:12]}"
    if request.param == "redis-stop":
        env["STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"] = "true"
    rules = [envoy_file(f) for f in ("basic.yaml", "another.yaml", "share_threshold.yaml")]
    server = start_server(tmp_path_factory.mktemp(request.param), rules=rules, store=store, env=env)
    server.stop_mode = request.param == "redis-stop"
    yield server
    assert 0 == server.stop()


def test_integration_unknown_domain_is_ok_with_no_limit(integration: Served) -> None:
    reply = ask(integration, "foo", descriptor(("hello", "world")))
    assert OK == reply.overall_code
    assert (OK, 0, 0, 0, "") == status_of(reply)
    assert not reply.statuses[0].HasField("current_limit")


def test_integration_first_hit_of_50_per_second(integration: Served) -> None:
    reply = ask(integration, "basic", descriptor(("key1", f"foo{random.getrandbits(40)}")))
    assert OK == reply.overall_code
    assert (OK, 50, Unit.SECOND, 49, "") == status_of(reply)


def test_integration_25_requests_on_20_per_minute(integration: Served) -> None:
    value = str(random.getrandbits(62))
    for i in range(25):
        reply = ask(integration, "another", descriptor(("key2", value)))
        over = i >= 20
        code = OVER_LIMIT if over else OK
        assert code == reply.overall_code, i
        assert (code, 20, Unit.MINUTE, 0 if over else 20 - (i + 1), "") == status_of(reply), i
        assert_reset_in_window(reply, 0, Unit.MINUTE)


def test_integration_15_requests_on_two_keys(integration: Served) -> None:
    """key2 (20/minute) and key3 (10/hour) in one request: from the 11th, key3 is over. By
    default key2 is still charged (Envoy's default); with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
    it stays at 10 left."""
    value = str(random.getrandbits(62))
    stop = getattr(integration, "stop_mode", False)
    for i in range(15):
        reply = ask(integration, "another", descriptor(("key2", value)), descriptor(("key3", value)))
        left1, left2, code = 20 - (i + 1), 10 - (i + 1), OK
        if i >= 10:
            code, left2 = OVER_LIMIT, 0
            if stop:
                left1 = 10
        assert code == reply.overall_code, i
        assert (OK, 20, Unit.MINUTE, left1, "") == status_of(reply, 0), i
        assert (code, 10, Unit.HOUR, left2, "") == status_of(reply, 1), i
        assert_reset_in_window(reply, 1, Unit.HOUR)


def test_integration_duration_until_reset_counts_down(integration: Served) -> None:
    value = f"durTest{random.getrandbits(40)}"
    first = ask(integration, "another", descriptor(("key4", value)))
    assert_reset_in_window(first, 0, Unit.DAY)
    # Envoy's case waits two seconds; a day's window has ticked down by then. Polling with
    # a deadline instead of sleeping: the duration is read again until it has moved.
    deadline = time.monotonic() + 5
    while True:
        second = ask(integration, "another", descriptor(("key4", value)))
        d1 = first.statuses[0].duration_until_reset.ToMicroseconds()
        d2 = second.statuses[0].duration_until_reset.ToMicroseconds()
        if d2 < d1 or time.monotonic() > deadline:
            break
    assert d2 < d1


def test_integration_share_threshold(integration: Served) -> None:
    """files/* with share_threshold: every matching value shares one counter of 10/hour;
    files_no_share/* gives each value its own."""
    domain = "share-threshold-test"
    for _ in range(10):
        ask(integration, domain, descriptor(("files", f"files/{uuid.uuid4().hex}.pdf")))
    reply = ask(integration, domain, descriptor(("files", "files/b.csv")))
    assert OVER_LIMIT == reply.overall_code
    assert (OVER_LIMIT, 10, Unit.HOUR, 0, "") == status_of(reply)
    base = time.time_ns()
    for _ in range(10):
        value = f"files_no_share/{base}-{random.getrandbits(62)}"
        reply = ask(integration, domain, descriptor(("files_no_share", value)))
        assert (OK, 10, Unit.HOUR, 9, "") == status_of(reply)


def test_integration_requests_per_unit_zero_blocks(tmp_path: Path) -> None:
    """reload.yaml's ``block`` (requests_per_unit: 0, the block list of Envoy's README) and its
    50/second key1 (Envoy's testConfigReload, without the reload)."""
    served = start_server(tmp_path, rules=[envoy_file("reload.yaml")])
    try:
        block = ask(served, "reload", descriptor(("block", "foo")))
        assert OVER_LIMIT == block.overall_code
        assert (OVER_LIMIT, 0, Unit.SECOND, 0, "") == status_of(block)
        key1 = ask(served, "reload", descriptor(("key1", "foo")))
        assert (OK, 50, Unit.SECOND, 49, "") == status_of(key1)
    finally:
        assert 0 == served.stop()


# --- test/service/ratelimit_test.go ----------------------------------------------------------

SERVICE_CASES = """
domain: {domain}
descriptors:
  - key: foo
    rate_limit: {{unit: minute, requests_per_unit: 10, name: key_name}}
  - key: hello
    value: unnamed
    rate_limit: {{unit: minute, requests_per_unit: 10}}
  - key: shadow
    shadow_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 1}}
  - key: regular
    rate_limit: {{unit: minute, requests_per_unit: 5}}
  - key: quota
    quota_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 3}}
  - key: quota2
    quota_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 3}}
  - key: free
    rate_limit: {{unlimited: true}}
  - key: replaced
    rate_limit: {{unit: minute, requests_per_unit: 1, name: old}}
  - key: replacing
    rate_limit: {{unit: minute, requests_per_unit: 5, replaces: [{{name: old}}]}}
"""


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str]]:
    domain = f"svc{uuid.uuid4().hex[:8]}"
    server = start_server(tmp_path_factory.mktemp("svc"), rules=[SERVICE_CASES.format(domain=domain)])
    yield server, domain
    assert 0 == server.stop()


def k() -> str:
    return uuid.uuid4().hex[:12]


def spend(served: Served, domain: str, key: str, value: str, n: int) -> None:
    """Use up ``n`` hits of one descriptor."""
    assert ask(served, domain, descriptor((key, value)), hits=n).statuses[0].code == OK


def test_service_no_limit_then_a_named_limit_over(svc: tuple[Served, str]) -> None:
    """TestService: a descriptor no limit matches is OK with no current_limit; an over limit
    answers its YAML name and 0 left, the other descriptor still OK."""
    served, domain = svc
    reply = ask(served, "test-domain", descriptor(("hello", "world")))
    assert OK == reply.overall_code and (OK, 0, 0, 0, "") == status_of(reply)
    user = k()
    spend(served, domain, "foo", user, 10)
    reply = ask(served, domain, descriptor(("foo", user)), descriptor(("hello", "world")))
    assert OVER_LIMIT == reply.overall_code
    assert (OVER_LIMIT, 10, Unit.MINUTE, 0, "key_name") == status_of(reply, 0)
    assert (OK, 0, 0, 0, "") == status_of(reply, 1)
    # "order does not affect results", and a limit without a name answers an empty name
    other = k()
    served_two = ask(served, domain, descriptor(("hello", "world")), descriptor(("foo", other)))
    assert (OK, 10, Unit.MINUTE, 9, "key_name") == status_of(served_two, 1)


def test_service_rule_shadow_mode(svc: tuple[Served, str]) -> None:
    """TestRuleShadowMode / TestMixedRuleShadowMode: a shadow descriptor over its limit is OK
    (with its limit and 0 left) and never makes the request OVER_LIMIT; a plain one does."""
    served, domain = svc
    user = k()
    spend(served, domain, "shadow", user, 1)
    reply = ask(served, domain, descriptor(("shadow", user)), descriptor(("hello", "world")))
    assert OK == reply.overall_code
    assert (OK, 1, Unit.MINUTE, 0, "") == status_of(reply, 0)
    spend(served, domain, "regular", user, 5)
    mixed = ask(served, domain, descriptor(("shadow", user)), descriptor(("regular", user)))
    assert OVER_LIMIT == mixed.overall_code
    assert [OK, OVER_LIMIT] == [s.code for s in mixed.statuses]


def test_service_quota_mode(svc: tuple[Served, str]) -> None:
    """TestServicePerDescriptorQuotaMode and friends: a plain descriptor over makes the
    request OVER_LIMIT; quota descriptors do only when every one of them is over."""
    served, domain = svc
    user = k()
    spend(served, domain, "regular", user, 5)
    reply = ask(served, domain, descriptor(("regular", user)), descriptor(("quota", user)))
    assert OVER_LIMIT == reply.overall_code  # PerDescriptorQuotaMode
    assert [OVER_LIMIT, OK] == [s.code for s in reply.statuses]
    fresh = k()
    spend(served, domain, "quota", fresh, 3)
    mixed = ask(served, domain, descriptor(("regular", fresh)), descriptor(("quota", fresh)))
    assert OVER_LIMIT == mixed.overall_code  # MixedPerDescriptorModes: the only quota one is over
    assert [OK, OVER_LIMIT] == [s.code for s in mixed.statuses]
    under = ask(served, domain, descriptor(("regular", k())), descriptor(("quota", k())))
    assert OK == under.overall_code  # MixedPerDescriptorModesUnderLimit
    some = k()
    spend(served, domain, "quota", some, 3)
    partly = ask(served, domain, descriptor(("quota", some)), descriptor(("quota2", some)))
    assert OK == partly.overall_code  # QuotaModeOnlySomeOverTheLimit
    assert [OVER_LIMIT, OK] == [s.code for s in partly.statuses]
    spend(served, domain, "quota2", some, 2)  # quota2 now has 0 left after partly's hit
    both = ask(served, domain, descriptor(("quota", some)), descriptor(("quota2", some)))
    assert OVER_LIMIT == both.overall_code  # QuotaModeOnlyAllOverTheLimit
    assert [OVER_LIMIT, OVER_LIMIT] == [s.code for s in both.statuses]


def test_service_unlimited_answers_max_uint32(svc: tuple[Served, str]) -> None:
    served, domain = svc
    reply = ask(served, domain, descriptor(("free", k())))
    assert OK == reply.overall_code
    assert (OK, 0, 0, 2**32 - 1, "") == status_of(reply)
    assert not reply.statuses[0].HasField("current_limit")


def test_service_replaces_drops_the_named_limit(svc: tuple[Served, str]) -> None:
    """TestServiceWithReplaces (restated): a matched limit that another matched limit
    replaces is not applied."""
    served, domain = svc
    user = k()
    spend(served, domain, "replaced", user, 1)
    reply = ask(served, domain, descriptor(("replaced", user)), descriptor(("replacing", user)))
    assert OK == reply.overall_code
    assert (OK, 0, 0, 0, "") == status_of(reply, 0)
    assert (OK, 5, Unit.MINUTE, 4, "") == status_of(reply, 1)


def test_service_override_on_an_unknown_domain_applies_nothing(svc: tuple[Served, str]) -> None:
    served, _ = svc
    d = descriptor(("foo", k()))
    d.limit.CopyFrom(ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(requests_per_unit=1, unit=Unit.HOUR))
    for _ in range(3):
        reply = ask(served, f"unknown{k()}", d)
        assert OK == reply.overall_code and (OK, 0, 0, 0, "") == status_of(reply)


def test_service_override_is_plain_and_unnamed(svc: tuple[Served, str]) -> None:
    """An override replaces the limit of a known domain even on a shadow descriptor (Envoy
    does not carry shadow_mode to an override)."""
    served, domain = svc
    d = descriptor(("shadow", k()))
    d.limit.CopyFrom(ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(requests_per_unit=2, unit=Unit.HOUR))
    codes = [ask(served, domain, d).overall_code for _ in range(3)]
    assert [OK, OK, OVER_LIMIT] == codes
    assert (OVER_LIMIT, 2, Unit.HOUR, 0, "") == status_of(ask(served, domain, d))


def test_service_descriptor_without_entries_is_ok(svc: tuple[Served, str]) -> None:
    served, domain = svc
    reply = ask(served, domain, ratelimit_pb2.RateLimitDescriptor(), descriptor(("foo", k())))
    assert OK == reply.overall_code
    assert (OK, 0, 0, 0, "") == status_of(reply, 0)
    assert (OK, 10, Unit.MINUTE, 9, "key_name") == status_of(reply, 1)


def test_service_hits_addend_zero_reports_without_charging(svc: tuple[Served, str]) -> None:
    served, domain = svc
    user = k()
    spend(served, domain, "regular", user, 5)
    for _ in range(2):
        look = ask(served, domain, descriptor(("regular", user), hits=0))
        assert OK == look.overall_code  # 5 of 5 used: not over, 0 left (Envoy adds 0 and compares)
        assert (OK, 5, Unit.MINUTE, 0, "") == status_of(look)
    other = k()
    spend(served, domain, "regular", other, 2)
    assert (OK, 5, Unit.MINUTE, 3, "") == status_of(ask(served, domain, descriptor(("regular", other), hits=0)))
    assert (OK, 5, Unit.MINUTE, 3, "") == status_of(ask(served, domain, descriptor(("regular", other), hits=0)))


def test_service_hits_over_what_is_left_is_over_with_zero_left(svc: tuple[Served, str]) -> None:
    served, domain = svc
    user = k()
    spend(served, domain, "regular", user, 3)
    reply = ask(served, domain, descriptor(("regular", user), hits=4))
    assert OVER_LIMIT == reply.overall_code
    assert (OVER_LIMIT, 5, Unit.MINUTE, 0, "") == status_of(reply)
    assert_reset_in_window(reply, 0, Unit.MINUTE)
    never = ask(served, domain, descriptor(("regular", k()), hits=6))  # more than the limit itself
    assert (OVER_LIMIT, 5, Unit.MINUTE, 0, "") == status_of(never)
    assert_reset_in_window(never, 0, Unit.MINUTE)


# --- charging: envoy, stop_over_limit, transaction (a difference documented in docs/service.md)

CHARGING_FILE = """
domain: {domain}
{charging}
descriptors:
  - key: wide
    rate_limit: {{unit: minute, requests_per_unit: 5}}
  - key: narrow
    rate_limit: {{unit: minute, requests_per_unit: 1}}
  - key: watched
    shadow_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 5}}
"""


def left_after_a_refusal(served: Served, domain: str) -> tuple[int, int]:
    """Use up ``narrow``, send wide + watched + narrow (refused), and look at what wide and
    watched have left: 4 when the refused request charged them, 5 when it did not."""
    user = k()
    spend(served, domain, "narrow", user, 1)
    refused = ask(
        served, domain, descriptor(("wide", user)), descriptor(("watched", user)), descriptor(("narrow", user))
    )
    assert OVER_LIMIT == refused.overall_code
    assert [OK, OK, OVER_LIMIT] == [s.code for s in refused.statuses]
    wide = status_of(ask(served, domain, descriptor(("wide", user), hits=0)))[3]
    watched = status_of(ask(served, domain, descriptor(("watched", user), hits=0)))[3]
    return wide, watched


@pytest.mark.parametrize(
    ("charging", "args", "env", "expected"),
    [
        (None, [], {}, (4, 4)),  # Envoy's default: every descriptor that fits is charged
        ("envoy", ["--envoy-charging", "transaction"], {}, (4, 4)),  # the file wins over the service
        ("stop_over_limit", [], {}, (5, 5)),
        ("transaction", [], {}, (5, 5)),
        (None, ["--envoy-charging", "stop_over_limit"], {}, (5, 5)),
        (None, [], {"RATEKEEPER_ENVOY_CHARGING": "transaction"}, (5, 5)),
        (None, [], {"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"}, (5, 5)),
    ],
    ids=["default", "file-over-service", "file-stop", "file-transaction", "option", "env", "envoy-env"],
)
def test_charging_of_a_refused_request(
    tmp_path: Path, charging: str | None, args: list[str], env: dict[str, str], expected: tuple[int, int]
) -> None:
    domain = f"c{k()}"
    text = CHARGING_FILE.format(domain=domain, charging=f"charging: {charging}" if charging else "")
    served = start_server(tmp_path, rules=[text], args=args, env=env)
    try:
        assert expected == left_after_a_refusal(served, domain)
    finally:
        assert 0 == served.stop()


def test_transaction_charges_every_descriptor_of_an_admitted_request(tmp_path: Path) -> None:
    domain = f"c{k()}"
    served = start_server(tmp_path, rules=[CHARGING_FILE.format(domain=domain, charging="charging: transaction")])
    try:
        user = k()
        reply = ask(served, domain, descriptor(("wide", user)), descriptor(("watched", user)))
        assert OK == reply.overall_code
        assert [4, 4] == [s.limit_remaining for s in reply.statuses]
    finally:
        assert 0 == served.stop()


def test_a_bad_service_charging_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="RATEKEEPER_ENVOY_CHARGING must be one of envoy, stop_over_limit"):
        start_server(
            tmp_path, rules=[CHARGING_FILE.format(domain="x", charging="")], env={"RATEKEEPER_ENVOY_CHARGING": "all"}
        )


def test_the_memory_store_aligns_fixed_windows_to_the_epoch() -> None:
    """As Redis and PostgreSQL count windows from the Unix epoch, so does the memory store:
    a minute's window ends on the wall clock's minute, whenever the process started."""
    from ratekeeper import Limiter, Rule

    rule = Rule("aligned", ["5/h"], algorithm="fixed_window")
    decision = Limiter("memory://").try_acquire(rule, "k")
    expected = 3600 - time.time() % 3600
    assert abs(decision.reset_after - expected) < 1.0
