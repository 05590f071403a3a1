"""The sliding window counter reproduces the system-design chapter's worked example on every
store of the suite, through the public API (issue 9, item 7)."""

from __future__ import annotations

from conformance.harness import StoreHarness
from conformance.test_keys import Calls
from ratekeeper import Rule

MINUTE_US = 60_000_000
T0 = 1_700_000_040_000_000  # a whole minute (µs)


def test_the_sliding_window_counter_reproduces_the_chapters_example(harness: StoreHarness) -> None:
    """7 per minute; 5 requests in the previous minute, 3 in the current one; 30 % into the
    minute a request counts 3 + floor(5 x 0.7) = 3 + floor(3.5) = 6: admitted; the next one
    counts 7: refused."""
    tag = harness.tag()
    calls = Calls(harness)
    rule = Rule(f"{tag}.chapter", ["7/minute"], "sliding_window_counter")
    for _ in range(5):
        assert calls.try_acquire(rule, "k", now=T0 - MINUTE_US).allowed
    for _ in range(3):  # 10 s in: the 5 count floor(5 x 50/60) = 4
        assert calls.try_acquire(rule, "k", now=T0 + 10_000_000).allowed
    at = T0 + 18_000_000  # 30 % into the minute
    admitted = calls.try_acquire(rule, "k", now=at)
    assert (True, 0) == (admitted.allowed, admitted.remaining)
    refused = calls.try_acquire(rule, "k", now=at)
    assert not refused.allowed
    # 5 x (60 s - e) < 3 x 60 s: the five count 2, leaving room for one, from 24 s + 1 µs in
    assert refused.retry_us == (T0 + 24_000_001) - at
