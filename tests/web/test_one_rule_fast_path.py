"""The one-rule fast path of the web core is the general path, taken faster.

A request that one enforced rule decides is answered by the limiter's ``try_acquire``,
its verdict built without the transaction's ``Outcome`` (``one_verdict``), its headers by
``one_rule_headers``: these must be exactly what the general path (``decision_flow`` run
by the limiter, ``rate_limit_headers``) gives for the same decisions, admitted or refused,
under every header option, renamed or left-out fields and a custom ``deny_response``.
(That the one-limit fields are the general fields: ``test_one_limit_headers``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ratekeeper import Limiter, Rule
from ratekeeper.config import HttpRule, KeyTemplate
from ratekeeper.config.model import Match, PathTemplate
from ratekeeper.decision import Decision
from ratekeeper.limiter.drive import drive
from ratekeeper.testing import FakeClock
from ratekeeper.web.asgi import request_view
from ratekeeper.web.base import Prepared
from ratekeeper.web.core import RateLimitCore
from ratekeeper.web.headers import HeaderOptions, header_names, one_rule_headers, rate_limit_headers
from ratekeeper.web.request import RequestView, Verdict

NOW = 1_700_000_000.5

OPTIONS = [
    HeaderOptions(),
    HeaderOptions(reset="epoch"),
    HeaderOptions(ratelimit=False),
    HeaderOptions(x_ratelimit=False),
    HeaderOptions(ratelimit=False, x_ratelimit=False),
    HeaderOptions(names=header_names({"RateLimit": None, "X-RateLimit-Reset": "X-Rate-Limit-Reset"})),
]


def _decisions(rule: Rule) -> list[Decision]:
    """Admitted, refused, never admissible, unused, and made up by each failure policy."""
    limiter = Limiter("memory://", clock=FakeClock())
    capacity = min(limit.count for limit in rule.limits)
    out = [limiter.try_acquire(rule, "k") for _ in range(capacity + 2)]
    out.append(limiter.try_acquire(rule, "other", max(limit.count for limit in rule.limits) + 1))
    out.append(limiter.peek(rule, "fresh"))
    out += [d.with_fallback(policy) for d in out[:1] + out[-3:-2] for policy in ("allow", "deny", "local")]
    return out


@pytest.mark.parametrize(
    "rule",
    [
        Rule("one", ["3/second"]),
        Rule("window", ["2/1500ms"], "fixed_window"),
        Rule("odd", ["1/1234567us"], "token_bucket"),
        Rule("two", ["3/second", "5/minute"], "sliding_window_counter"),
        Rule("slots", ["2/minute"], "concurrency"),
    ],
    ids=lambda r: r.name,
)
def test_one_rule_headers_are_rate_limit_headers_of_its_pair(rule: Rule) -> None:
    for d in _decisions(rule):
        for options in OPTIONS:
            for allowed in (True, False):
                general = rate_limit_headers([(rule, d)], allowed=allowed, options=options, now=lambda: NOW)
                fast = one_rule_headers(rule, d, allowed=allowed, options=options, now=lambda: NOW)
                assert fast == general, (d, options, allowed)


def _view() -> RequestView:
    return RequestView(method="GET", path="/items", host="api.example", peer="10.0.0.7")


def _core(rule: Rule, **options: Any) -> RateLimitCore:
    limiter = Limiter("memory://", clock=FakeClock())
    return RateLimitCore([HttpRule(rule)], limiter=limiter, **options)


def _general_check(core: RateLimitCore, view: RequestView) -> Verdict:
    """What ``check`` answers through the transaction, as a request of several rules is."""
    prepared = core.prepare(view)
    assert isinstance(prepared, Prepared)
    return drive(core.limiter, core.decision_flow(prepared))


def _deny(denied: Sequence[Decision]) -> tuple[int, list[tuple[str, str]], bytes]:
    return 503, [("X-Denied", ",".join(d.rule for d in denied))], b"busy"


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"x_ratelimit_reset": "epoch"},
        {"header_names": {"X-RateLimit-Limit": None, "RateLimit-Policy": "X-Policy"}},
        {"ratelimit_headers": False},
        {"deny_response": _deny},
    ],
    ids=["defaults", "epoch", "renamed", "x-only", "deny_response"],
)
def test_a_request_of_one_rule_gets_the_verdict_of_its_transaction(options: dict[str, Any]) -> None:
    rule = Rule("items", ["3/minute", "10/hour"])
    fast, general = _core(rule, **options), _core(rule, **options)
    verdicts = []
    for _ in range(5):  # admitted three times, then refused
        view = _view()
        one = fast.check(view)
        assert one == _general_check(general, view)
        verdicts.append(one)
    assert [v.allowed for v in verdicts] == [True, True, True, False, False]
    assert verdicts[0].charges and not verdicts[-1].charges
    if "deny_response" in options:
        assert (verdicts[-1].status, verdicts[-1].body) == (503, b"busy")
        assert ("X-Denied", "items") in verdicts[-1].headers


class _Timings:
    """The metrics calls the core makes itself (the limiter, given as ``limiter=``, reports none)."""

    def __init__(self) -> None:
        self.timed: list[bool] = []
        self.skipped_rules: list[str] = []

    def decision_time(self, seconds: float, allowed: bool) -> None:
        assert seconds >= 0
        self.timed.append(allowed)

    def shadow_rules(self, names: Any) -> None:
        pass

    def skipped(self, rule: str) -> None:
        self.skipped_rules.append(rule)

    def reloaded(self, ok: bool) -> None:
        pass

    def request(self, transport: str) -> None:
        pass


def test_decisions_are_timed_unless_no_rule_applied() -> None:
    """A request exempt or matched by no rule is not timed (the limiter was never asked); one
    whose rules were all skipped is, as one decided by the limiter, admitted or refused."""
    metrics = _Timings()
    rules = [
        HttpRule(Rule("items", ["1/minute"]), match=Match(paths=(PathTemplate.parse("/items"),))),
        HttpRule(
            Rule("keyed", ["1/minute"]),
            match=Match(paths=(PathTemplate.parse("/keyed"),)),
            key=KeyTemplate.parse("{header.x-api-key}"),
        ),
    ]
    core = RateLimitCore(
        rules, limiter=Limiter("memory://", clock=FakeClock()), metrics=metrics, exempt_methods=["OPTIONS"]
    )
    verdicts = [
        core.check(RequestView(method=method, path=path, peer="10.0.0.7"))
        for method, path in [
            ("OPTIONS", "/items"),
            ("GET", "/other"),
            ("GET", "/keyed"),
            ("GET", "/items"),
            ("GET", "/items"),
        ]
    ]
    assert [v.exempt for v in verdicts] == [True, False, False, False, False]
    assert verdicts[2].skipped == ("keyed",) and metrics.skipped_rules == ["keyed"]
    assert [v.allowed for v in verdicts[2:]] == [True, True, False]
    assert metrics.timed == [True, True, False]  # the skipped one, then the limiter's two


def test_an_asgi_header_is_found_whatever_the_case_of_its_name_and_repeats_are_joined() -> None:
    """ASGI asks servers for lower-case names; one that sends others still has its headers
    read (the lookup lowers the names of the wanted length only)."""
    raw = [
        (b"Host", b"api.example"),
        (b"x-api-key", b"k1"),
        (b"X-Forwarded-For", b"10.0.0.1"),
        (b"x-forwarded-for", b"10.0.0.2"),
        (b"X-API-KEYS", b"not this one"),
    ]
    view = request_view({"type": "http", "method": "GET", "path": "/", "headers": raw, "client": ("10.0.0.9", 1)})
    assert view.host == "api.example"
    assert view.header("X-Api-Key") == "k1"
    assert view.header("x-forwarded-for") == "10.0.0.1, 10.0.0.2"
    assert view.header("x-missing") is None
    assert dict(view.headers)["x-api-keys"] == "not this one"
