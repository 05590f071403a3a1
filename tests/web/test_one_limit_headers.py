"""The headers of a decision of a rule of one limit, worked out once for both families,
are what the general ``ratelimit_fields`` and ``x_ratelimit_fields`` write for it: admitted,
refused, a cost that is never admitted, a window no whole-second policy states, every
algorithm and every header option."""

from __future__ import annotations

import pytest

from ratekeeper import Limiter, Rule
from ratekeeper.decision import Decision
from ratekeeper.testing import FakeClock
from ratekeeper.web.headers import (
    HeaderOptions,
    rate_limit_headers,
    ratelimit_fields,
    retry_after_seconds,
    x_ratelimit_fields,
)

OPTIONS = [
    HeaderOptions(),
    HeaderOptions(reset="epoch"),
    HeaderOptions(ratelimit=False),
    HeaderOptions(x_ratelimit=False),
    HeaderOptions(ratelimit=False, x_ratelimit=False),
]


def _general(rule: Rule, d: Decision, options: HeaderOptions) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    if options.ratelimit:
        headers += ratelimit_fields([d])
    if options.x_ratelimit:
        headers += x_ratelimit_fields([d], options.reset, lambda: 1_700_000_000.5)
    if not d.allowed:
        retry = retry_after_seconds([d])
        if retry is not None:
            headers.append(("Retry-After", str(retry)))
    return headers


def _decisions(rule: Rule) -> list[Decision]:
    limiter = Limiter("memory://", clock=FakeClock())
    capacity = rule.limits[0].count
    out = [limiter.try_acquire(rule, "k") for _ in range(capacity + 2)]
    out.append(limiter.try_acquire(rule, "other", capacity + 1))  # never admitted
    out.append(limiter.peek(rule, "fresh"))
    return out


@pytest.mark.parametrize(
    "algorithm",
    ["gcra", "token_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter", "leaky_bucket"],
)
@pytest.mark.parametrize("limit", ["3/second", "2/1500ms", "5/minute", "1/1234567us"])
def test_one_limit_headers_are_the_general_fields(algorithm: str, limit: str) -> None:
    rule = Rule("r", [limit], algorithm)
    for d in _decisions(rule):
        for options in OPTIONS:
            ours = rate_limit_headers([(rule, d)], allowed=d.allowed, options=options, now=lambda: 1_700_000_000.5)
            assert ours == _general(rule, d, options), (d, options)
