"""Deep debts in buckets of nearly 2**53 units are decided alike on every store.

A charge without a check takes a bucket below empty by at most one capacity, and never so
deep that the time until it is whole reaches 2**53 units (``bucket.deepest_debt``): Lua's
doubles would round it. These rules hold buckets of 5.3e15 to 8.8e15 units, near epoch
µs of 2**52, where one capacity of debt would pass 2**53."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.harness import StoreHarness
from ratekeeper import Limit, Rule
from ratekeeper.op import Op

TEN_YEARS_US = 3650 * 86_400 * 1_000_000
NOW = 2**52 + 12_345


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra", "leaky_bucket"])
@pytest.mark.parametrize(("count", "burst"), [(3, 50), (3, 85), (1, 28)])
def test_a_deep_debt_near_2_53_is_exact_on_every_store(
    harness: StoreHarness, algorithm: str, count: int, burst: int
) -> None:
    rule = Rule(f"{harness.tag()}.deep", [Limit.from_us(count, TEN_YEARS_US, burst)], algorithm=algorithm)
    plan = rule.plan
    state: Any = None
    for cost, at in [(burst, 0), (burst + 7, 1), (3, 17), (1, 10**9), (0, 10**10), (5, 10**14)]:
        state, expected = plan.algorithm.charge(plan, state, NOW + at, cost)
        assert harness.call("decide", Op.charge(plan, "k", cost), NOW + at) == expected, (cost, at)
    for at in (10**10, 10**13, 10**15):
        state, expected = plan.decide(state, NOW + at, 1, None, None)
        assert harness.call("decide", Op.decide(plan, "k", 1), NOW + at) == expected, at
