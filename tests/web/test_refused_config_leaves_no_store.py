"""A configuration the core refuses makes no store: nothing is left open that nobody could close."""

from __future__ import annotations

import pytest

from ratekeeper.config import parse_rules
from ratekeeper.errors import ConfigurationError
from ratekeeper.web import WSGIRateLimitMiddleware
from ratekeeper.web.core import RateLimitCore
from ratekeeper.web.core_async import AsyncRateLimitCore

ROUTE_RULES = parse_rules("rules: [{name: by-route, limits: [5/s], key: '{route}'}]", "rules.yaml")
PLAIN_RULES = parse_rules("rules: [{name: plain, limits: [5/s]}]", "rules.yaml")


def _refuse_stores(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every limiter the web cores make, by the store it was asked for."""
    made: list[str] = []
    for core_class in (RateLimitCore, AsyncRateLimitCore):

        def record(store: str, *args: object, _real: type = core_class.limiter_class, **kwargs: object) -> object:
            made.append(store)
            return _real(store, *args, **kwargs)

        monkeypatch.setattr(core_class, "limiter_class", staticmethod(record))
    return made


def test_an_unkeyable_rule_refused_at_start_opens_no_store(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _refuse_stores(monkeypatch)
    with pytest.raises(ConfigurationError, match="route"):
        WSGIRateLimitMiddleware(lambda environ, start: [], rules=ROUTE_RULES, store="memory://")
    assert [] == made


def test_a_bad_option_refused_at_start_opens_no_store(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _refuse_stores(monkeypatch)
    with pytest.raises(ConfigurationError, match="ipv6_prefix"):
        AsyncRateLimitCore(PLAIN_RULES, store="memory://", ipv6_prefix=200)
    assert [] == made


def test_a_good_configuration_makes_its_store_once(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _refuse_stores(monkeypatch)
    AsyncRateLimitCore(PLAIN_RULES, store="memory://")
    assert ["memory://"] == made
