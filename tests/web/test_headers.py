"""The rate-limit headers and the 429 body, parsed with http_sf (not ratekeeper's code)."""

from __future__ import annotations

import json
from typing import Any

import http_sf

from ratekeeper import Limiter, Rule
from ratekeeper.decision import Decision
from ratekeeper.testing import FakeClock
from ratekeeper.web.headers import (
    policy_names,
    ratelimit_fields,
    retry_after_seconds,
    sf_string,
    x_ratelimit_fields,
)
from ratekeeper.web.problem import QUOTA_EXCEEDED, problem_body


def sf(value: str) -> dict[str, dict[str, Any]]:
    return {name: dict(params) for name, params in http_sf.parse(value.encode(), tltype="list")}  # type: ignore[misc]


def decisions(limits: list[str], calls: int, cost: int = 1, algorithm: str = "gcra") -> list[Decision]:
    clock = FakeClock()
    limiter = Limiter("memory://", clock=clock)
    rule = Rule("r", limits, algorithm)
    return [limiter.try_acquire(rule, "k", cost) for _ in range(calls)]


def test_one_limit_is_one_policy_named_after_the_rule() -> None:
    d = decisions(["1/2s"], 1)[0]
    fields = dict(ratelimit_fields([d]))
    assert {"r": {"q": 1, "w": 2}} == sf(fields["RateLimit-Policy"])
    assert {"r": {"r": 0, "t": 2}} == sf(fields["RateLimit"])


def test_several_limits_and_rules_are_list_members_and_parse() -> None:
    a = decisions(["20/minute", "5/3s"], 6, algorithm="sliding_window_log")[-1]
    fields = dict(ratelimit_fields([a]))
    assert {"r.60s": {"q": 20, "w": 60}, "r.3s": {"q": 5, "w": 3}} == sf(fields["RateLimit-Policy"])
    state = sf(fields["RateLimit"])
    assert 15 == state["r.60s"]["r"]
    assert 0 == state["r.3s"]["r"]
    assert 3 == state["r.3s"]["t"]
    assert ["r.1s.0", "r.1s.1"] == policy_names("r", Rule("r", ["1/s", "2/s"]).limits)


def test_windows_that_are_not_whole_seconds_are_advertised_exactly_or_not_at_all() -> None:
    """``w`` is whole seconds: a limit is scaled to the shortest whole-second window that
    holds a whole number of its windows (10/100ms is 100 a second, not 10), or left out."""
    d = decisions(["10/100ms"], 1)[0]
    assert {"r": {"q": 100, "w": 1}} == sf(dict(ratelimit_fields([d]))["RateLimit-Policy"])
    d = decisions(["10/1500ms"], 1)[0]
    assert {"r": {"q": 20, "w": 3}} == sf(dict(ratelimit_fields([d]))["RateLimit-Policy"])
    assert [] == ratelimit_fields(decisions(["10/1234567us"], 1))
    two = decisions(["1/1234567us", "5/s"], 1)[0]
    assert {"r.1s": {"q": 5, "w": 1}} == sf(dict(ratelimit_fields([two]))["RateLimit-Policy"])


def test_x_ratelimit_reports_the_refusing_limit_and_retry_after_rounds_up() -> None:
    d = decisions(["20/minute", "5/3s"], 6, algorithm="sliding_window_log")[-1]
    assert not d.allowed
    fields = dict(x_ratelimit_fields([d]))
    assert {"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "3"} == fields
    assert 3 == retry_after_seconds([d])


def test_retry_after_is_never_zero_and_absent_when_never_admissible() -> None:
    denied = decisions(["1000/s"], 2, cost=1000)[-1]  # frees up in 1 ms
    assert not denied.allowed
    assert 1 == retry_after_seconds([denied])
    never = decisions(["5/s"], 1, cost=6)[0]
    assert None is retry_after_seconds([never])
    body = json.loads(problem_body([never], None))
    assert None is body["retry_after"]
    assert "will not be admitted" in body["detail"]


def test_the_problem_body_fields() -> None:
    d = decisions(["1/3s"], 2)[-1]
    body = json.loads(problem_body([d], 3))
    assert QUOTA_EXCEEDED == body["type"]
    assert (429, ["r"], "r", "1/3s", 3) == (
        body["status"],
        body["violated-policies"],
        body["rule"],
        body["limit"],
        body["retry_after"],
    )


def test_names_that_need_escaping_stay_valid_strings() -> None:
    assert 'a"b\\c' == http_sf.parse(sf_string('a"b\\c').encode(), tltype="item")[0]
    assert "caf?" == http_sf.parse(sf_string("café").encode(), tltype="item")[0]


def test_a_batch_of_one_rule_for_several_keys_names_the_policy_once_with_its_tightest_state() -> None:
    """Checks of one rule for two keys: one policy member, and the state of the key with
    the least left (a list with the same member twice would leave a client guessing)."""
    limiter = Limiter("memory://", clock=FakeClock())
    rule = Rule("r", ["5/minute"])
    limiter.try_acquire(rule, "busy", 4)
    batch = limiter.try_acquire_many([(rule, "fresh", 1), (rule, "busy", 1)])
    fields = dict(ratelimit_fields(batch.decisions))
    assert {"r": {"q": 5, "w": 60}} == sf(fields["RateLimit-Policy"])
    assert 0 == sf(fields["RateLimit"])["r"]["r"]
    assert 1 == fields["RateLimit"].count('"r"')
