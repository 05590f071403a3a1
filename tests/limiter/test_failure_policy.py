"""The failure policy (``on_error``) and the circuit breaker, against a store that fails on demand.

``FlakyStore`` is a memory store that raises the error it is told to raise instead of
deciding, and counts the calls that reach it; time is a ``FakeClock``, so the breaker's
cool-down passes only when a test advances it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from ratekeeper import AsyncLimiter, ConfigurationError, Decision, Limiter, Rule, StoreError, StoreTimeout
from ratekeeper.algorithms.base import Plan
from ratekeeper.errors import CircuitOpen
from ratekeeper.limiter.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from ratekeeper.limiter.failure import POLICIES, FailurePolicy
from ratekeeper.op import Op
from ratekeeper.stores.memory import MemoryStore
from ratekeeper.testing import FakeClock

LOGIN = Rule("login", ["3/minute"], algorithm="sliding_window_log")
READS = Rule("reads", ["100/s"], algorithm="token_bucket", on_error="allow")


class FlakyStore:
    """A ``Store`` over a ``MemoryStore`` that raises ``fail`` (a fresh copy each call) when set."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.memory = MemoryStore(clock=clock)
        self.fail: StoreError | None = None
        self.calls = 0

    def _enter(self) -> None:
        self.calls += 1
        if self.fail is not None:
            error = type(self.fail)(str(self.fail))
            raise error from ConnectionRefusedError("connection refused")

    def decide(self, op: Op, now: int | None = None) -> Decision:
        self._enter()
        return self.memory.decide(op, now)

    def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        self._enter()
        return self.memory.decide_many(ops, now)

    def refund(self, op: Op, now: int | None = None) -> None:
        self._enter()
        self.memory.refund(op, now)

    def reset(self, plan: Plan, key: str) -> None:
        self._enter()
        self.memory.reset(plan, key)

    def close(self) -> None:
        pass


class AsyncFlakyStore:
    """The ``AsyncStore`` twin of ``FlakyStore`` (same counters)."""

    def __init__(self, clock: FakeClock) -> None:
        self.sync = FlakyStore(clock)
        self.clock = clock

    async def decide(self, op: Op, now: int | None = None) -> Decision:
        await asyncio.sleep(0)
        return self.sync.decide(op, now)

    async def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        return self.sync.decide_many(ops, now)

    async def refund(self, op: Op, now: int | None = None) -> None:
        self.sync.refund(op, now)

    async def reset(self, plan: Plan, key: str) -> None:
        self.sync.reset(plan, key)

    async def aclose(self) -> None:
        pass


def flaky(on_error: str = "raise", **options: Any) -> tuple[Limiter, FlakyStore, FakeClock]:
    clock = FakeClock()
    store = FlakyStore(clock)
    return Limiter(store, on_error=on_error, **options), store, clock


DOWN = StoreError("Redis is unreachable: connection refused")
SLOW = StoreTimeout("Redis did not answer in time")


# --------------------------------------------------------------------------- the four policies


def test_raise_hands_the_store_error_to_the_caller_with_its_cause() -> None:
    limiter, store, _ = flaky("raise")
    store.fail = DOWN
    with pytest.raises(StoreError, match="unreachable") as info:
        limiter.try_acquire(LOGIN, "u1")
    assert isinstance(info.value.__cause__, ConnectionRefusedError)
    assert 1 == limiter.failures.count("login", cause="error", outcome="raise")


def test_allow_admits_as_a_whole_key_would_and_marks_the_fallback() -> None:
    limiter, store, clock = flaky("allow")
    store.fail = SLOW
    decision = limiter.try_acquire(LOGIN, "u1", cost=2)
    _, whole = LOGIN.plan.decide(None, clock.now_us(), 2, None, None)
    assert (True, 1, "allow") == (decision.allowed, decision.remaining, decision.fallback)
    assert whole.with_fallback("allow") == decision
    assert decision != whole  # a fallback is never equal to a store's decision
    assert 1 == limiter.failures.count("login", cause="timeout", outcome="allow")


def test_allow_still_refuses_a_cost_no_state_could_admit() -> None:
    limiter, store, _ = flaky("allow")
    store.fail = DOWN
    decision = limiter.try_acquire(LOGIN, "u1", cost=4)
    assert (False, float("inf"), "allow") == (decision.allowed, decision.retry_after, decision.fallback)


def test_deny_refuses_with_the_breaker_cool_down_as_retry_after() -> None:
    limiter, store, clock = flaky("deny", breaker=CircuitBreaker(2, cool_down=3.0))
    store.fail = DOWN
    first = limiter.try_acquire(LOGIN, "u1")
    assert (False, 3.0, LOGIN.limits[0], "deny") == (first.allowed, first.retry_after, first.denied_by, first.fallback)
    limiter.try_acquire(LOGIN, "u1")  # the second failure opens the breaker
    clock.advance(1.25)
    assert 1.75 == limiter.try_acquire(LOGIN, "u1").retry_after
    assert (0, 0) == (first.remaining, first.delay_us)


def test_local_decides_with_the_same_rule_on_a_private_memory_store() -> None:
    limiter, store, clock = flaky("local")
    reference = MemoryStore(clock=clock)
    store.fail = DOWN
    got = [limiter.try_acquire(LOGIN, "u1") for _ in range(4)]
    want = [reference.decide(Op.decide(LOGIN.plan, "u1", 1)) for _ in range(4)]
    assert [w.with_fallback("local") for w in want] == got
    assert [True, True, True, False] == [bool(g) for g in got]
    assert {"local"} == {g.fallback for g in got}
    assert 3 == store.memory.decide(Op.peek(LOGIN.plan, "u1", 0)).remaining  # the store saw nothing


def test_local_peek_charges_nothing() -> None:
    limiter, store, _ = flaky("local")
    store.fail = DOWN
    for _ in range(5):
        assert limiter.peek(LOGIN, "u1").allowed
    assert 3 == limiter.peek(LOGIN, "u1", 0).remaining


def test_store_decisions_carry_no_fallback() -> None:
    limiter, _, _ = flaky("allow")
    decision = limiter.try_acquire(LOGIN, "u1")
    assert (True, None) == (decision.allowed, decision.fallback)
    assert "fallback" not in decision.as_dict()
    assert 0 == limiter.failures.count()


def test_fallback_shows_in_repr_and_as_dict() -> None:
    limiter, store, _ = flaky("deny")
    store.fail = DOWN
    decision = limiter.try_acquire(LOGIN, "u1")
    assert "fallback='deny'" in repr(decision)
    assert "deny" == decision.as_dict()["fallback"]


# --------------------------------------------------------------------------- per-rule override


def test_a_rule_overrides_the_limiters_policy() -> None:
    limiter, store, _ = flaky("raise")
    store.fail = DOWN
    assert "allow" == limiter.try_acquire(READS, "u1").fallback
    with pytest.raises(StoreError):
        limiter.try_acquire(LOGIN, "u1")
    assert 1 == limiter.failures.count("reads", outcome="allow")
    assert 1 == limiter.failures.count("login", outcome="raise")


def test_fail_open_for_reads_and_fail_closed_for_login() -> None:
    """The platform team's setup: one limiter, the policy chosen per rule."""
    limiter, store, _ = flaky("raise")
    login = Rule("auth.login", ["5/minute"], on_error="deny")
    store.fail = DOWN
    assert limiter.try_acquire(READS, "u1")
    assert not limiter.try_acquire(login, "u1")
    assert {("reads", "error", "allow"): 1, ("auth.login", "error", "deny"): 1} == dict(limiter.failures.counts)


def test_an_unknown_policy_is_refused_with_the_four_listed() -> None:
    with pytest.raises(ConfigurationError, match="'allow', 'deny', 'local', 'raise', got 'fail-open'"):
        Rule("r", "1/s", on_error="fail-open")
    with pytest.raises(ConfigurationError, match="'allow', 'deny', 'local', 'raise'"):
        Limiter(on_error="ignore")
    assert ("allow", "deny", "local", "raise") == POLICIES


def test_on_error_is_part_of_a_rules_equality_not_its_hash() -> None:
    plain, allow = Rule("r", "1/s"), Rule("r", "1/s", on_error="allow")
    assert (None, "allow") == (plain.on_error, allow.on_error)
    assert plain != allow
    assert hash(plain) == hash(allow)
    assert Rule("r", "1/s", on_error="allow") == allow
    assert "on_error='allow'" in repr(allow)
    with pytest.raises(AttributeError):
        allow.on_error = "deny"  # type: ignore[misc]


# --------------------------------------------------------------------------- the breaker in the limiter


def test_breaker_opens_after_consecutive_failures_and_stops_calling_the_store() -> None:
    limiter, store, _ = flaky("allow", breaker=CircuitBreaker(3, cool_down=5.0))
    store.fail = DOWN
    for _ in range(10):
        assert limiter.try_acquire(LOGIN, "u1")
    assert 3 == store.calls
    assert OPEN == limiter.breaker.state
    assert 3 == limiter.failures.count(cause="error")
    assert 7 == limiter.failures.count(cause="open")


def test_after_the_cool_down_one_probe_goes_through_and_a_failed_probe_reopens() -> None:
    limiter, store, clock = flaky("allow", breaker=CircuitBreaker(2, cool_down=1.0))
    store.fail = DOWN
    for _ in range(5):
        limiter.try_acquire(LOGIN, "u1")
    assert 2 == store.calls
    clock.advance(1.0)
    for _ in range(5):
        limiter.try_acquire(LOGIN, "u1")
    assert (3, OPEN) == (store.calls, limiter.breaker.state)
    assert 1 == limiter.breaker.transitions[HALF_OPEN, OPEN]


def test_a_successful_probe_closes_the_breaker_and_the_store_decides_again() -> None:
    limiter, store, clock = flaky("deny", breaker=CircuitBreaker(2, cool_down=1.0))
    store.fail = DOWN
    for _ in range(3):
        assert not limiter.try_acquire(LOGIN, "u1")
    store.fail = None
    assert not limiter.try_acquire(LOGIN, "u1")  # still open: not called
    clock.advance(1.0)
    probe = limiter.try_acquire(LOGIN, "u1")
    assert (True, None, CLOSED) == (probe.allowed, probe.fallback, limiter.breaker.state)
    calls = store.calls
    assert limiter.try_acquire(LOGIN, "u1").fallback is None
    assert calls + 1 == store.calls
    assert limiter._store_decide == store.decide  # the hot path calls the store directly again


def test_a_success_ends_the_failure_streak() -> None:
    limiter, store, _ = flaky("allow", breaker=CircuitBreaker(3))
    for _ in range(3):
        store.fail = DOWN
        limiter.try_acquire(LOGIN, "u1")
        limiter.try_acquire(LOGIN, "u1")
        store.fail = None
        limiter.try_acquire(LOGIN, "u1")
    assert CLOSED == limiter.breaker.state
    assert limiter._store_decide == store.decide


def test_the_hot_path_is_the_bare_store_call_until_something_fails() -> None:
    limiter, store, _ = flaky("allow")
    assert limiter._store_decide == store.decide
    store.fail = DOWN
    limiter.try_acquire(LOGIN, "u1")
    assert limiter._store_decide == limiter._guarded_decide


def test_under_raise_an_open_breaker_raises_circuit_open_without_calling_the_store() -> None:
    limiter, store, _ = flaky("raise", breaker=CircuitBreaker(1, cool_down=10.0))
    store.fail = SLOW
    with pytest.raises(StoreTimeout):
        limiter.try_acquire(LOGIN, "u1")
    with pytest.raises(CircuitOpen, match=r"circuit breaker is open .*next try in 10\.000s"):
        limiter.try_acquire(LOGIN, "u1")
    assert 1 == store.calls
    assert issubclass(CircuitOpen, StoreError)


def test_breaker_false_never_opens() -> None:
    limiter, store, _ = flaky("allow", breaker=False)
    store.fail = DOWN
    for _ in range(50):
        limiter.try_acquire(LOGIN, "u1")
    assert (50, CLOSED) == (store.calls, limiter.breaker.state)


def test_every_store_call_is_behind_the_breaker() -> None:
    limiter, store, _ = flaky("allow", breaker=CircuitBreaker(1, cool_down=10.0))
    store.fail = DOWN
    limiter.try_acquire(LOGIN, "u1")
    assert OPEN == limiter.breaker.state
    limiter.peek(LOGIN, "u1")
    limiter.try_acquire_many([(LOGIN, "u1"), (READS, "u1")])
    limiter.refund(LOGIN, "u1")
    limiter.reset(LOGIN, "u1")
    limiter.acquire(LOGIN, "u1", timeout=0)
    assert 1 == store.calls


def test_breaker_opening_and_closing_are_logged_once_not_per_request(caplog: pytest.LogCaptureFixture) -> None:
    limiter, store, clock = flaky("allow", breaker=CircuitBreaker(2, cool_down=1.0))
    store.fail = DOWN
    with caplog.at_level(logging.WARNING, logger="ratekeeper.store"):
        for _ in range(100):
            limiter.try_acquire(LOGIN, "u1")
        store.fail = None
        clock.advance(1.0)
        for _ in range(100):
            limiter.try_acquire(READS, "u1")
    messages = [r.getMessage() for r in caplog.records if r.name == "ratekeeper.store"]
    assert 2 == len(messages), messages
    assert "circuit breaker opened" in messages[0] and "FlakyStore" in messages[0]
    assert "circuit breaker closed" in messages[1]


def test_counts_and_snapshot_are_per_rule_never_per_key() -> None:
    limiter, store, _ = flaky("local", breaker=CircuitBreaker(2, cool_down=1.0))
    store.fail = DOWN
    for i in range(5):
        limiter.try_acquire(LOGIN, f"user-{i}")
    snap = limiter.failures.snapshot()
    assert {("login", "error", "local"): 2, ("login", "open", "local"): 3} == snap["fallbacks"]
    assert (OPEN, {(CLOSED, OPEN): 1}) == (snap["breaker"], snap["transitions"])


# --------------------------------------------------------------------------- batches, refunds, resets, acquire


def test_a_batch_raises_when_any_of_its_rules_raises() -> None:
    limiter, store, _ = flaky("allow")
    strict = Rule("strict", "5/s", on_error="raise")
    store.fail = DOWN
    with pytest.raises(StoreError):
        limiter.try_acquire_many([(READS, "u1"), (strict, "u1")])
    assert {("reads", "error", "raise"): 1, ("strict", "error", "raise"): 1} == dict(limiter.failures.counts)


def test_a_batch_is_refused_when_any_of_its_rules_denies() -> None:
    limiter, store, _ = flaky("local")
    closed = Rule("closed", "5/s", on_error="deny")
    store.fail = DOWN
    batch = limiter.try_acquire_many([(READS, "u1"), (LOGIN, "u1"), (closed, "u1")])
    assert (False, [True, True, False]) == (batch.allowed, [d.allowed for d in batch])
    assert {"deny"} == {d.fallback for d in batch}
    assert 3 == limiter.peek(LOGIN, "u1", 0).remaining  # the local item was only looked at


def test_a_batch_of_local_and_allow_rules_is_decided_locally_all_or_nothing() -> None:
    limiter, store, _ = flaky("local")
    store.fail = DOWN
    assert limiter.try_acquire_many([(READS, "u1"), (LOGIN, "u1", 2)])
    refused = limiter.try_acquire_many([(READS, "u1"), (LOGIN, "u1", 2)])
    assert (False, ["allow", "local"]) == (refused.allowed, [d.fallback for d in refused])
    assert 1 == limiter.peek(LOGIN, "u1", 0).remaining


def test_refund_and_reset_raise_under_raise_and_are_dropped_otherwise() -> None:
    limiter, store, _ = flaky("raise", breaker=False)
    store.fail = DOWN
    with pytest.raises(StoreError):
        limiter.refund(LOGIN, "u1")
    with pytest.raises(StoreError):
        limiter.reset(LOGIN, "u1")
    limiter.refund(READS, "u1")
    limiter.reset(READS, "u1")
    assert 2 == limiter.failures.count("reads", outcome="allow")


def test_refund_and_reset_reach_the_local_store_under_local() -> None:
    limiter, store, _ = flaky("local")
    store.fail = DOWN
    for _ in range(3):
        limiter.try_acquire(LOGIN, "u1")
    limiter.refund(LOGIN, "u1")
    assert 1 == limiter.peek(LOGIN, "u1", 0).remaining
    limiter.reset(LOGIN, "u1")
    assert 3 == limiter.peek(LOGIN, "u1", 0).remaining


def test_acquire_waits_for_a_local_reservation_when_the_store_is_down() -> None:
    limiter, store, clock = flaky("local")
    rule = Rule("partner", ["1/2s"], algorithm="gcra")
    store.fail = DOWN
    assert limiter.acquire(rule, "p").allowed
    decision = limiter.acquire(rule, "p", timeout=5)
    assert (True, 2.0, "local") == (decision.allowed, decision.delay, decision.fallback)
    assert [2.0] == clock.slept


def test_acquire_under_deny_gives_up_with_rate_limit_exceeded() -> None:
    from ratekeeper import RateLimitExceeded

    limiter, store, _ = flaky("deny")
    store.fail = DOWN
    with pytest.raises(RateLimitExceeded):
        limiter.acquire(Rule("partner", ["1/2s"], algorithm="gcra"), "p", timeout=0.5)


def test_a_concurrency_rule_under_allow_hands_out_a_lease_id() -> None:
    limiter, store, _ = flaky("allow")
    jobs = Rule("jobs", ["2/minute"], algorithm="concurrency")
    store.fail = DOWN
    with limiter.lease(jobs, "tenant") as lease:
        assert lease.id
    assert 2 == limiter.failures.count("jobs", outcome="allow")  # the lease, then its release


# --------------------------------------------------------------------------- asyncio


def test_async_limiter_applies_the_same_policy_and_breaker() -> None:
    async def main() -> None:
        clock = FakeClock()
        store = AsyncFlakyStore(clock)
        limiter = AsyncLimiter(store, on_error="local", breaker=CircuitBreaker(2, cool_down=1.0))
        store.sync.fail = SLOW
        decisions = [await limiter.try_acquire(LOGIN, "u1") for _ in range(4)]
        assert [True, True, True, False] == [bool(d) for d in decisions]
        assert (2, OPEN) == (store.sync.calls, limiter.breaker.state)
        assert "allow" == (await limiter.try_acquire(READS, "u1")).fallback
        store.sync.fail = None
        clock.advance(1.0)
        assert (await limiter.try_acquire(LOGIN, "u1")).fallback is None
        assert CLOSED == limiter.breaker.state
        assert limiter._store_decide == store.decide
        await limiter.aclose()

    asyncio.run(main())


def test_async_batches_refunds_and_resets_follow_the_policy() -> None:
    async def main() -> None:
        store = AsyncFlakyStore(FakeClock())
        async with AsyncLimiter(store, on_error="deny") as limiter:
            store.sync.fail = DOWN
            assert not await limiter.try_acquire_many([(LOGIN, "u1")])
            await limiter.refund(LOGIN, "u1")
            await limiter.reset(LOGIN, "u1")
            assert not await limiter.peek(LOGIN, "u1")
            assert 4 == limiter.failures.count("login", outcome="deny")

    asyncio.run(main())


# --------------------------------------------------------------------------- the breaker alone


def test_half_open_lets_exactly_one_probe_through() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(1, cool_down=2.0, clock=clock)
    breaker.record_failure()
    assert (False, 2.0) == (breaker.allow(), breaker.remaining())
    clock.advance(2.0)
    assert [True, False, False] == [breaker.allow() for _ in range(3)]
    assert HALF_OPEN == breaker.state


def test_a_probe_that_never_reports_is_replaced_after_the_cool_down() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(1, cool_down=2.0, clock=clock)
    breaker.record_failure()
    clock.advance(2.0)
    assert breaker.allow()
    clock.advance(1.999)
    assert not breaker.allow()
    clock.advance(0.001)
    assert breaker.allow()


def test_failure_rate_opens_on_intermittent_failures() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(None, failure_rate=0.5, min_calls=10, window=10.0, clock=clock)
    for _ in range(5):
        breaker.record_failure()
        breaker.record_success()
    assert CLOSED == breaker.state  # 5 of 10 calls failed, no 5 in a row
    breaker.record_failure()
    assert OPEN == breaker.state  # 6 of 11


def test_failure_rate_forgets_a_window_without_failures() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(None, failure_rate=0.5, min_calls=4, window=1.0, clock=clock)
    breaker.record_failure()
    breaker.record_success()
    assert breaker.guarded
    clock.advance(1.0)
    breaker.record_success()
    assert (CLOSED, False) == (breaker.state, breaker.guarded)
    breaker.record_failure()
    breaker.record_success()
    breaker.record_success()
    assert CLOSED == breaker.state  # 1 of 3 calls failed in this window


def test_breaker_options_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="failures must be a positive integer"):
        CircuitBreaker(0)
    with pytest.raises(ConfigurationError, match=r"failure_rate must be a share in \(0, 1\]"):
        CircuitBreaker(failure_rate=1.5)
    with pytest.raises(ConfigurationError, match="cool_down must be > 0 seconds"):
        CircuitBreaker(cool_down=0)
    with pytest.raises(ConfigurationError, match="cool_down must be a finite number"):
        CircuitBreaker(cool_down=float("nan"))


def test_a_breaker_around_a_store_call_refuses_while_open_and_counts_a_success() -> None:
    """``with breaker:`` is ``check`` before the call and ``record_success`` after an answer;
    a failure is left to the failure policy that handles it."""
    clock = FakeClock()
    breaker = CircuitBreaker(1, cool_down=1.0, clock=clock)
    with pytest.raises(StoreError), breaker:
        raise StoreError("down")
    assert CLOSED == breaker.state  # not recorded by the context manager
    breaker.record_failure()
    with pytest.raises(CircuitOpen), breaker:
        raise AssertionError("the call is not made while the breaker is open")
    clock.advance(1.0)
    with breaker:  # the probe
        pass
    assert CLOSED == breaker.state


def test_a_breaker_serves_one_limiter() -> None:
    breaker = CircuitBreaker()
    Limiter(breaker=breaker)
    with pytest.raises(ConfigurationError, match="already serves a limiter"):
        Limiter(breaker=breaker)


def test_reset_closes_the_breaker() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(1, clock=clock)
    breaker.record_failure()
    breaker.reset()
    assert (CLOSED, True) == (breaker.state, breaker.allow())


def test_a_timeout_is_ignored_by_the_memory_store() -> None:
    """The memory store never waits on I/O: ``timeout`` has nothing to bound there."""
    assert Limiter("memory://", timeout=0.1).try_acquire(LOGIN, "u1")


def test_the_policy_object_is_shared_by_both_limiters() -> None:
    assert isinstance(Limiter().failure_policy, FailurePolicy)
    assert "raise" == Limiter().on_error == AsyncLimiter().on_error


def test_the_readme_example_answers_as_it_says() -> None:
    """README "When the store fails", run against a failing store instead of Redis."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## When the store fails", 1)[1]
    block = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]
    block = re.sub(r'Limiter\("redis://localhost:6379/0", timeout=0\.5,\n\s*', "Limiter(store, ", block)
    store = FlakyStore(FakeClock())
    store.fail = DOWN
    namespace: dict[str, Any] = {"store": store}
    assert "Limiter(store, " in block, "the README's Limiter(...) line is no longer the one this test replaces"
    exec(compile(block, "README failure example", "exec"), namespace)
    limiter: Limiter = namespace["limiter"]
    assert "allow" == namespace["d"].fallback
    assert not limiter.try_acquire(namespace["login"], "u-42")
    assert "local" == limiter.try_acquire(namespace["search"], "u-42").fallback
    assert 1 == limiter.failures.count("auth.login", outcome="deny")
    assert CLOSED == limiter.failures.snapshot()["breaker"]


def test_a_refused_batch_keeps_the_fallback_mark_but_hands_out_no_lease() -> None:
    limiter, store, _ = flaky("allow")
    jobs = Rule("jobs", ["2/minute"], algorithm="concurrency")
    closed = Rule("closed", "5/s", on_error="deny")
    store.fail = DOWN
    batch = limiter.try_acquire_many([(jobs, "tenant"), (closed, "tenant")])
    assert not batch
    assert [(None, "deny"), (None, "deny")] == [(d.lease_id, d.fallback) for d in batch]


def test_only_one_of_many_threads_probes_a_half_open_breaker() -> None:
    import threading

    clock = FakeClock()
    breaker = CircuitBreaker(1, cool_down=1.0, clock=clock)
    breaker.record_failure()
    clock.advance(1.0)
    start = threading.Barrier(8)
    allowed: list[bool] = []

    def ask() -> None:
        start.wait()
        allowed.extend(breaker.allow() for _ in range(100))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (1, 800) == (allowed.count(True), len(allowed))
    assert 1 == breaker.transitions[OPEN, HALF_OPEN]
