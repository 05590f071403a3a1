"""Every store carries a key's state across a change of limits as the reference does.

The reference (tests/algorithms/test_limit_changes.py) defines the answer; here each
store of the conformance harness (memory, Redis standalone, Cluster and Sentinel,
PostgreSQL, the service; sync and asyncio) decides the same scripts at explicit times,
decision by decision, and the counts a user sees are pinned: a rule tightened during an
incident hands out no fresh budget, the quota fetched after the failsafe counts what the
failsafe admitted. Then hypothesis traces whose rules all share one name (one rule whose
limits keep changing) run through ``conformance.traces.Session``.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.harness import (
    POSTGRES_URL,
    REDIS_URL,
    STORES,
    StoreHarness,
    delete_redis_keys,
    drop_schema,
    harness_of,
)
from conformance.traces import Session, Trace, examples, rule_specs, traces
from ratekeeper import AsyncLimiter, Limiter, Quota
from ratekeeper.op import Op
from ratekeeper.rule import Rule

T0 = 1_750_000_020_000_000
"""Epoch µs on a whole minute (fixed windows begin here), near the stores' own clocks."""
S = 1_000_000

BUCKETS = ("token_bucket", "gcra", "leaky_bucket")
WINDOWS = ("fixed_window", "sliding_window_log", "sliding_window_counter")


@pytest.fixture(scope="module", params=STORES)
def harness(request: pytest.FixtureRequest) -> Iterator[StoreHarness]:
    yield from harness_of(request)


class Script:
    """One key of one rule name on a store, beside the reference's state for it."""

    def __init__(self, harness: StoreHarness, algorithm: str) -> None:
        tag = harness.tag()
        self.harness = harness
        self.algorithm = algorithm
        self.name = f"{tag}.api"
        self.key = f"{tag}.client"
        self.state: Any = None

    def hits(self, limits: list[str], count: int, now: int, burst: int | None = None) -> int:
        """``count`` requests under ``limits`` at ``now``: each decision equal to the
        reference's; how many were admitted."""
        plan = Rule(self.name, limits, self.algorithm, burst=burst).plan
        allowed = 0
        for _ in range(count):
            got = self.harness.call("decide", Op.decide(plan, self.key, 1), now)
            self.state, want = plan.algorithm.decide(plan, self.state, now, 1, None, None)
            assert tuple(got) == tuple(want), f"{self.harness.name}: store {got!r}, reference {want!r}"
            allowed += got.allowed
        return allowed


@pytest.mark.parametrize("algorithm", BUCKETS + WINDOWS)
def test_failsafe_then_quota_admits_the_quota_in_all(harness: StoreHarness, algorithm: str) -> None:
    """2/minute (the failsafe), then the provider's 3/minute within the second: 3 in all."""
    script = Script(harness, algorithm)
    assert script.hits(["2/minute"], 2, T0) == 2
    assert script.hits(["3/minute"], 5, T0 + 1000) == 1


@pytest.mark.parametrize("algorithm", BUCKETS + WINDOWS)
def test_tightened_limit_hands_out_no_fresh_budget(harness: StoreHarness, algorithm: str) -> None:
    """10/minute with 8 used, tightened to 3/minute: nothing left; raised to 20/minute: 12."""
    script = Script(harness, algorithm)
    assert script.hits(["10/minute"], 8, T0) == 8
    assert script.hits(["3/minute"], 3, T0 + 1000) == 0
    assert script.hits(["20/minute"], 20, T0 + 2000) == 12


@pytest.mark.parametrize("algorithm", BUCKETS)
def test_partly_refilled_and_reburst(harness: StoreHarness, algorithm: str) -> None:
    """A unit partly refilled stays consumed (10/minute, 9 s after 10 used, carried to
    60/minute: 51 left), and a change of burst alone carries too."""
    script = Script(harness, algorithm)
    assert script.hits(["10/minute"], 10, T0) == 10
    assert script.hits(["60/minute"], 60, T0 + 9 * S) == 51
    other = Script(harness, algorithm)
    assert other.hits(["10/minute"], 10, T0, burst=10) == 10
    assert other.hits(["10/minute"], 20, T0, burst=20) == 10


def test_concurrency_leases_stay_held_across_a_change(harness: StoreHarness) -> None:
    """3 leases of 5/minute; the count lowered to 2: refused with 0 remaining (never a
    negative number); raised to 4: one more lease, then refused."""
    tag = harness.tag()
    key = f"{tag}.client"
    state: Any = None
    got = []
    for n, limit in enumerate(["5/minute"] * 3 + ["2/minute", "4/minute", "4/minute"]):
        plan = Rule(f"{tag}.pool", [limit], "concurrency").plan
        lease = f"{tag}.lease{n}"
        decision = harness.call("decide", Op.decide(plan, key, 1, None, lease), T0)
        state, want = plan.algorithm.decide(plan, state, T0, 1, None, lease)
        assert (decision.allowed, decision.remaining_each) == (want.allowed, want.remaining_each)
        got.append((decision.allowed, decision.remaining_each[0]))
    assert got == [(True, 4), (True, 3), (True, 2), (False, 0), (True, 0), (False, 0)]


@st.composite
def renamed_traces(draw: st.DrawFn, algorithm: str) -> Trace:
    """A trace whose two or three rules are one rule (one name) with changing limits."""
    trace = draw(traces(algorithm))
    rules = (*trace.rules, draw(rule_specs(algorithm)))
    ops = draw(st.permutations(trace.ops))
    return Trace(rules, trace.keys, trace.start, tuple(ops), (0,) * len(rules))


@pytest.mark.slow  # hypothesis traces on every store
@pytest.mark.parametrize("algorithm", BUCKETS + WINDOWS)
def test_store_carries_like_the_reference_on_traces(harness: StoreHarness, algorithm: str) -> None:
    """Hypothesis traces of one rule whose limits change between operations: every
    decision of the store equals the reference's."""

    @settings(
        max_examples=examples(10),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(renamed_traces(algorithm))
    def check(trace: Trace) -> None:
        Session(harness.call, trace.rules, trace.keys, trace.start, harness.tag(), trace.names).run(trace.ops)

    check()


class GatedProvider:
    """A quota provider answering 3/minute once ``gate`` is set (the failsafe serves until then)."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def __call__(self, key: str) -> list[str]:
        self.gate.wait(10)
        return ["3/minute"]


def store_url(kind: str) -> tuple[str, dict[str, Any], Any]:
    unique = uuid.uuid4().hex[:12]
    if kind == "memory":
        return "memory://", {}, lambda: None
    if kind == "redis":
        prefix = f"rk-limit-changes-{unique}:"
        return REDIS_URL, {"prefix": prefix}, lambda: delete_redis_keys(prefix)
    schema = f"rk_limit_changes_{unique}"
    return POSTGRES_URL, {"schema": schema}, lambda: drop_schema(schema)


URLS = [
    pytest.param("memory", id="memory"),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.mark.parametrize("algorithm", ["gcra", "token_bucket", "fixed_window"])
@pytest.mark.parametrize("kind", URLS)
def test_quota_after_the_failsafe_counts_what_the_failsafe_admitted(kind: str, algorithm: str) -> None:
    """The issue's case through ``Limiter`` and ``Quota`` on the server's clock: failsafe
    2/minute, then the provider's 3/minute within the second: 3 admitted, not 5."""
    url, options, cleanup = store_url(kind)
    provider = GatedProvider()
    quota = Quota(provider)
    rule = Rule("api", ["2/minute"], algorithm, quota=quota)
    try:
        with Limiter(url, **options) as limiter:
            first = [limiter.try_acquire(rule, "client").allowed for _ in range(2)]
            provider.gate.set()
            assert quota.wait_idle(10)
            then = [limiter.try_acquire(rule, "client").allowed for _ in range(5)]
    finally:
        provider.gate.set()
        quota.close()
        cleanup()
    assert first == [True, True]
    assert then == [True, False, False, False, False]


@pytest.mark.parametrize("kind", URLS)
def test_async_quota_after_the_failsafe_counts_what_the_failsafe_admitted(kind: str) -> None:
    """The same through ``AsyncLimiter`` (an async provider on the caller's loop)."""
    url, options, cleanup = store_url(kind)

    async def main() -> tuple[list[bool], list[bool]]:
        gate = asyncio.Event()

        async def provider(key: str) -> list[str]:
            await gate.wait()
            return ["3/minute"]

        quota = Quota(provider)
        rule = Rule("api", ["2/minute"], "gcra", quota=quota)
        limiter = AsyncLimiter(url, **options)
        try:
            first = [(await limiter.try_acquire(rule, "client")).allowed for _ in range(2)]
            gate.set()
            await quota.drain()
            then = [(await limiter.try_acquire(rule, "client")).allowed for _ in range(5)]
        finally:
            gate.set()
            await limiter.aclose()
        return first, then

    try:
        first, then = asyncio.run(main())
    finally:
        cleanup()
    assert first == [True, True]
    assert then == [True, False, False, False, False]
