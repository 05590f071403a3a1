"""The request-to-decision core without a server: real limiters on the memory store
(and a store that is down), requests described as ``RequestView``s."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.config.model import HttpRule, KeyTemplate
from ratekeeper.errors import ConfigurationError
from ratekeeper.testing import FakeClock
from ratekeeper.web.core import RateLimitCore
from ratekeeper.web.core_async import AsyncRateLimitCore
from ratekeeper.web.request import RequestView

from .conftest import http_rule


def core(rules: list[Any], **options: Any) -> RateLimitCore:
    options.setdefault("limiter", Limiter("memory://", clock=FakeClock()))
    return RateLimitCore(rules, **options)


def get(path: str = "/items/a", **fields: Any) -> RequestView:
    fields.setdefault("peer", "192.0.2.1")
    return RequestView("GET", path, **fields)


def statuses(c: RateLimitCore, views: list[RequestView]) -> list[int]:
    return [v.status for v in (c.check(view) for view in views)]


def test_one_batch_for_every_enforced_rule_and_a_refusal_charges_none() -> None:
    """Rule a admits 2, rule b admits 1: the 2nd request is refused by b, and a keeps the
    unit that b's refusal did not burn."""
    a = http_rule("a", "2/minute")
    b = http_rule("b", "1/minute")
    c = core([a, b])
    first, second = c.check(get()), c.check(get())
    assert (True, False) == (first.allowed, second.allowed)
    assert [("a", True), ("b", False)] == [(d.rule, d.allowed) for d in second.decisions]
    only_a = core([a], limiter=c.limiter)
    assert [200, 429] == statuses(only_a, [get(), get()])  # a had 1 left, not 0


def test_rules_match_by_method_path_and_host() -> None:
    c = core([http_rule("post", "1/minute", methods=("POST",), path="/items/{user}")])
    assert [200, 200] == statuses(c, [get(), get()])
    post = RequestView("POST", "/items/a", peer="192.0.2.1")
    assert [True, False] == [c.check(post).allowed, c.check(post).allowed]


def test_each_key_part_is_read_from_the_request() -> None:
    rule = http_rule("k", "1/minute", key="{method}|{host}|{query.page}|{user}|{route}|{header.x-org}|{client_ip}")
    c = core([rule])
    view = dict(
        host="API.example:8443",
        headers={"x-org": "o1"},
        query_string="page=2&page=3",
        user=lambda: "alice",
        route="/items/{user}",
    )
    first = c.check(get(**view))
    assert first.allowed
    assert [("k", "GET|api.example|2|alice|/items/{user}|o1|192.0.2.1")] == [
        (ch.rule.name, ch.key) for ch in first.charges
    ]
    assert not c.check(get(**view)).allowed


def test_a_user_callable_option_wins_over_the_integrations_user() -> None:
    c = core([http_rule("u", "1/minute", key="{user}")], user=lambda view: view.header("x-user"))
    assert [200, 429, 200] == statuses(
        c, [get(headers={"x-user": "a"}, user="x"), get(headers={"x-user": "a"}), get(headers={"x-user": "b"})]
    )


def test_an_unbuildable_key_skips_the_rule_and_an_unreadable_cost_charges_one() -> None:
    """A missing key part skips its rule (counted); a cost template the request does not
    fill charges 1, so leaving the header out never dodges the rule."""
    skips: list[str] = []

    class Metrics:
        def shadow_rules(self, names: Any) -> None: ...
        def configured_rules(self, names: Any, source: str = "") -> None: ...
        def skipped(self, rule: str) -> None:
            skips.append(rule)

        def reloaded(self, ok: bool) -> None: ...

    rules = [
        http_rule("by_key", "1/minute", key="{header.x-key}"),
        http_rule("by_cost", "1/minute", cost="{header.x-cost}"),
        http_rule("always", "5/minute"),
    ]
    c = core(rules, metrics=Metrics())
    verdict = c.check(get(headers={"x-cost": "lots"}))
    assert verdict.allowed
    assert ("by_key",) == verdict.skipped
    assert ["by_key"] == skips
    assert ["by_cost", "always"] == [d.rule for d in verdict.decisions]
    assert not c.check(get()).allowed  # no header at all: charged 1 again, over 1/minute


def test_cost_options() -> None:
    rule = http_rule("c", "10/minute")
    assert [200, 429] == statuses(core([rule], cost=6), [get(), get()])
    assert [200, 200, 429] == statuses(core([rule], cost={"c": "{header.x-n}"}), [get(headers={"x-n": "5"})] * 3)
    assert [200, 429] == statuses(core([rule], cost={"c": lambda view: 7}), [get(), get()])
    fallback = core([rule], cost=lambda view, r: None)  # None: the rule's own cost (1)
    assert [200] * 10 + [429] == statuses(fallback, [get()] * 11)
    with pytest.raises(ConfigurationError, match="cost"):
        core([rule], cost=-1)


def test_exemptions() -> None:
    rule = http_rule("e", "1/minute", key="{header.x-key}")
    c = core(
        [rule],
        exempt_paths=["/health", "/static/*"],
        exempt_methods=["options"],
        exempt_keys={"e": ["admin"]},
        exempt_networks=["10.0.0.0/8"],
        exempt=lambda view: view.query("free") == "1",
    )
    h = {"headers": {"x-key": "u"}}
    exempt = [
        get("/health", **h),
        get("/static/app.js", **h),
        RequestView("OPTIONS", "/x", headers={"x-key": "u"}, peer="192.0.2.1"),
        get(headers={"x-key": "admin"}),
        get(peer="10.1.2.3", **h),
        get(query_string="free=1", **h),
    ]
    for view in exempt * 2:
        verdict = c.check(view)
        assert verdict.allowed and verdict.exempt and not verdict.headers
    assert [200, 429] == statuses(c, [get(**h), get(**h)])


def test_shadow_rules_are_charged_apart_and_never_refuse() -> None:
    c = core([http_rule("enforced", "3/minute"), http_rule("dry", "1/minute", shadow=True)])
    verdicts = [c.check(get()) for _ in range(4)]
    assert [True, True, True, False] == [v.allowed for v in verdicts]
    assert [True, False, False, False] == [v.shadow[0].allowed for v in verdicts]
    assert all("dry" not in value for v in verdicts for _, value in v.headers)


def test_refunds_by_status_and_leases_released_after_every_response() -> None:
    c = core([http_rule("r", "1/minute")], refund_statuses={500, 503})
    v = c.check(get())
    c.finish(v, 503)
    v = c.check(get())
    assert v.allowed
    c.finish(v, 200)
    assert not c.check(get()).allowed
    leases = core([http_rule("in_flight", "1/minute", algorithm="concurrency")])
    held = leases.check(get())
    assert held.charges[0].lease_id is not None
    assert not leases.check(get()).allowed
    leases.finish(held, 200)
    assert leases.check(get()).allowed


def test_the_async_driver_decides_as_the_sync_one() -> None:
    async def run() -> list[tuple[bool, bool]]:
        c = AsyncRateLimitCore(
            [http_rule("a", "2/minute"), http_rule("s", "1/minute", shadow=True)],
            limiter=AsyncLimiter("memory://", clock=FakeClock()),
        )
        out = []
        for _ in range(3):
            v = await c.check(get())
            out.append((v.allowed, v.shadow[0].allowed))
            await c.finish(v, 200)
        await c.aclose()
        return out

    assert [(True, True), (True, False), (False, False)] == asyncio.run(run())


def test_the_wrong_kind_of_limiter_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="AsyncLimiter"):
        AsyncRateLimitCore([], limiter=Limiter("memory://"))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="Limiter"):
        RateLimitCore([], limiter=AsyncLimiter("memory://"))  # type: ignore[arg-type]


def test_an_unknown_option_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"exempt_path \(did you mean .exempt_paths.\?\)"):
        RateLimitCore([], exempt_path=["/health"])  # type: ignore[call-arg]


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


def test_a_store_that_is_down_follows_each_rules_on_error() -> None:
    """Fail open for reads, closed for login: the fallback is visible on the decision."""
    limiter = Limiter(f"redis://127.0.0.1:{closed_port()}/0", on_error="allow", timeout=0.5)
    reads = http_rule("reads", "100/minute", path="/items/{user}")
    login = http_rule("login", "100/minute", path="/login", on_error="deny")
    c = RateLimitCore([reads, login], limiter=limiter)
    try:
        read = c.check(get())
        denied = c.check(get("/login"))
    finally:
        limiter.close()
    assert read.allowed and "allow" == read.decisions[0].fallback
    assert not denied.allowed and "deny" == denied.decisions[0].fallback
    # not a quota: the limiter is unavailable (503, its own problem type, no quota headers)
    assert 503 == denied.status
    assert "urn:ratekeeper:problem:limiter-unavailable" == json.loads(denied.body)["type"]
    assert ["login"] == json.loads(denied.body)["rules"]
    assert [] == [h for h in read.headers if "ratelimit" in h[0].lower()]


def test_rules_given_as_bare_rules_apply_to_every_request_keyed_by_client_address() -> None:
    c = core([Rule("per_client", "2/minute")])
    assert [200, 200, 200, 429] == statuses(c, [get("/a"), get("/b", peer="192.0.2.9"), get("/c"), get("/d")])


def test_a_star_key_is_one_budget_for_every_client() -> None:
    c = core([HttpRule(Rule("global", "2/minute"), key=KeyTemplate.parse("*"))])
    assert [200, 200, 429] == statuses(c, [get("/a"), get("/b", peer="192.0.2.9"), get("/c")])


def test_exempt_keys_name_what_they_exempt_from() -> None:
    """A rule's exempt key leaves only that rule out; a template exempts the request;
    the old bare list (compared with every rule's key) is refused with the form to use."""
    by_key = http_rule("k", "1/minute", key="{header.x-key}")
    by_tenant = http_rule("t", "1/minute", key="{header.x-tenant}")
    c = core([by_key, by_tenant], exempt_keys={"k": ["admin"], "{query.probe}": "secret"})
    admin = get(headers={"x-key": "admin", "x-tenant": "a"})
    verdicts = [c.check(admin) for _ in range(2)]
    assert [True, False] == [v.allowed for v in verdicts]  # "t" still limits the admin key
    assert ["t"] == [d.rule for d in verdicts[0].decisions]
    sneaky = get(headers={"x-key": "u", "x-tenant": "admin"})
    assert [200, 429] == statuses(c, [sneaky, sneaky])
    probe = get(headers={"x-key": "u", "x-tenant": "u"}, query_string="probe=secret")
    assert all(c.check(probe).exempt for _ in range(3))
    only = core([by_key], exempt_keys={"k": "admin"})
    assert only.check(get(headers={"x-key": "admin"})).exempt  # every matching rule exempted
    with pytest.raises(ConfigurationError, match="exempt_keys must say what each key is exempt from"):
        core([by_key], exempt_keys=["admin"])
    with pytest.raises(ConfigurationError, match="unknown request part"):
        core([by_key], exempt_keys={"{nope}": ["x"]})
    assert core([by_key], exempt_keys=[]).exempt_keys == {}


def test_costs_are_ascii_digits_and_capped() -> None:
    rule = http_rule("c", "10/minute", cost="{header.x-cost}")
    c = core([rule])
    for text in ("\xb2", "\u0663", "1e3", "-1", " "):
        verdict = c.check(get(headers={"x-cost": text}))
        assert verdict.charges[0].cost == 1, text  # MISSING_COST
    huge = c.check(get(headers={"x-cost": "9" * 18}))
    assert not huge.allowed and huge.status == 429  # beyond every limit: refused, not an error


def test_a_deny_response_is_checked_and_a_bad_one_falls_back_to_the_429(caplog: pytest.LogCaptureFixture) -> None:
    rule = http_rule("d", "1/minute")
    good = core([rule], deny_response=lambda denied: (503, [(b"X-A", b"1"), ("X-B", "2")], "busy"))
    good.check(get())
    verdict = good.check(get())
    assert (503, b"busy") == (verdict.status, verdict.body)
    assert ("X-A", "1") in verdict.headers and ("X-B", "2") in verdict.headers
    answers: list[Any] = [
        (429, [("X-A", "1\r\nSet-Cookie: a=b")], b""),
        (429, [("Bad Name", "1")], b""),
        (42, [], b""),
        (429, [("X-A", 1)], b""),
        (429, [], 7),
        "not a tuple",
    ]
    for answer in answers:
        bad = core([http_rule("d", "1/minute")], deny_response=lambda denied, a=answer: a)
        bad.check(get())
        verdict = bad.check(get())
        assert 429 == verdict.status and ("Content-Type", "application/problem+json") in verdict.headers, answer
    assert "deny_response did not answer" in caplog.text


def test_a_key_over_512_characters_is_bounded() -> None:
    rule = http_rule("b", "1/minute", key="{header.x-key}")
    c = core([rule])
    verdict = c.check(get(headers={"x-key": "k" * 5000}))
    assert verdict.allowed and len(verdict.charges[0].key) == 512
    assert not c.check(get(headers={"x-key": "k" * 5000})).allowed
    by_callable = core([http_rule("b2", "1/minute")], key=lambda view, r: "c" * 900)
    assert len(by_callable.check(get()).charges[0].key) == 512


def test_the_middlewares_rules_are_the_metrics_labels_however_many_and_whichever_core() -> None:
    """Each core tells the metrics its rules: they keep labels of their own past the cap
    that applies to names nobody configured, and two cores sharing one ``Metrics`` (a
    middleware and a FastAPI dependency) do not take each other's labels away."""
    from ratekeeper.metrics import OTHER_RULE, Metrics

    metrics = Metrics(max_rules=1)
    limiter = Limiter("memory://", clock=FakeClock(), observer=metrics)
    first = core([http_rule("a", "5/minute"), http_rule("b", "5/minute")], metrics=metrics, limiter=limiter)
    second = core([http_rule("c", "5/minute")], metrics=metrics, limiter=limiter)
    for c in (first, second):
        assert c.check(get()).allowed
    for name in ("a", "b", "c"):
        assert metrics.value("ratekeeper_decisions_total", rule=name, outcome="within") == 1
    assert metrics.value("ratekeeper_decisions_total", rule=OTHER_RULE, outcome="within") is None
