"""A decision after a charge without a check has ``remaining`` below zero while the key is
in debt; the headers clamp it at the HTTP layer: never a negative ``r=`` or
``X-RateLimit-Remaining``, whatever the rule's limits."""

from __future__ import annotations

import pytest

from ratekeeper import Limiter, Rule
from ratekeeper.web.headers import HeaderOptions, rate_limit_headers


@pytest.mark.parametrize("limits", [["10/s"], ["10/s", "50/min"]])
@pytest.mark.parametrize("allowed", [True, False])
def test_a_key_in_debt_is_reported_with_nothing_remaining(limits: list[str], allowed: bool) -> None:
    rule = Rule("debt", limits, algorithm="token_bucket")
    with Limiter("memory://") as limiter:
        decision = limiter.charge(rule, "key", 15)
    assert decision.remaining == -5
    headers = dict(rate_limit_headers([(rule, decision)], allowed=allowed, options=HeaderOptions()))
    assert headers["X-RateLimit-Remaining"] == "0"
    assert ";r=0;" in headers["RateLimit"]
    assert "-" not in headers["RateLimit"]
