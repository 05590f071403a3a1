"""The observer seam's optional reports (``ratekeeper.limiter.observer``): charges and
refunds go to an observer that has ``charged`` / ``refunded``, keys only to one that asks
(``wants_keys``); an observer of the three required methods keeps working, sync and async."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.decision import Decision
from ratekeeper.errors import StoreError
from ratekeeper.testing import FakeClock
from servers import free_port

TOKENS = Rule("tokens", "100/min", algorithm="token_bucket")


class ThreeMethods:
    """An observer written before charges were reported: only the required methods."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []
        self.store_calls = 0

    def decided(self, decision: Decision) -> None:
        self.decisions.append(decision)

    def store_call(self, seconds: float, error: StoreError | None) -> None:
        self.store_calls += 1

    def breaker_changed(self, old: str, new: str) -> None:
        pass


class KeyedObserver(ThreeMethods):
    """An observer that takes every optional report, keys included."""

    wants_keys = True

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str] = []
        self.charges: list[tuple[str, int, int, str]] = []  # (rule, cost, remaining, key)
        self.refunds: list[tuple[str, int]] = []

    def decided(self, decision: Decision, key: str | None = None) -> None:  # type: ignore[override]
        assert key is not None, "an observer that wants keys is always given one"
        super().decided(decision)
        self.keys.append(key)

    def charged(self, decision: Decision, cost: int, key: str) -> None:
        self.charges.append((decision.rule, cost, decision.remaining, key))

    def refunded(self, rule: str, cost: int) -> None:
        self.refunds.append((rule, cost))


def use_every_path(limiter: Limiter) -> None:
    limiter.try_acquire(TOKENS, "a", 10)
    limiter.try_acquire_many([(TOKENS, "b"), (TOKENS, "c", 2)])
    limiter.charge(TOKENS, "a", 120)
    limiter.refund(TOKENS, "a", 5)
    with limiter.lease(Rule("slots", "1/min", algorithm="concurrency"), "a"):
        pass


def test_an_observer_without_the_new_methods_is_told_what_it_was_told_before() -> None:
    observer = ThreeMethods()
    with Limiter("memory://", clock=FakeClock(), observer=observer) as limiter:
        use_every_path(limiter)
    assert [("tokens", True), ("tokens", True), ("tokens", True), ("slots", True)] == [
        (d.rule, d.allowed) for d in observer.decisions
    ]  # try_acquire, the batch's two, the lease: not the charge
    assert 6 == observer.store_calls  # try_acquire, batch, charge, refund, lease, release


def test_an_async_limiter_with_such_an_observer_works_alike() -> None:
    observer = ThreeMethods()

    async def run() -> Decision:
        async with AsyncLimiter("memory://", clock=FakeClock(), observer=observer) as limiter:
            await limiter.try_acquire(TOKENS, "a")
            after = await limiter.charge(TOKENS, "a", 150)
            await limiter.refund(TOKENS, "a", 3)
            return after

    assert -51 == asyncio.run(run()).remaining
    assert 1 == len(observer.decisions)
    assert 3 == observer.store_calls


def test_such_an_observer_under_a_failure_policy_is_not_told_the_charge() -> None:
    observer = ThreeMethods()
    with Limiter(f"redis://127.0.0.1:{free_port()}/0", on_error="allow", timeout=0.5, observer=observer) as limiter:
        assert "allow" == limiter.charge(TOKENS, "a", 5).fallback
        assert "allow" == limiter.try_acquire(TOKENS, "a").fallback
    assert ["allow"] == [d.fallback for d in observer.decisions]


def test_an_observer_that_wants_keys_gets_each_decisions_and_charges_key() -> None:
    observer = KeyedObserver()
    with Limiter("memory://", clock=FakeClock(), observer=observer) as limiter:
        use_every_path(limiter)
    assert ["a", "b", "c", "a"] == observer.keys
    assert [("tokens", 120, -30, "a")] == observer.charges
    assert [("tokens", 5)] == observer.refunds  # the lease's release is not a refund


def test_the_failure_policys_decisions_and_charges_carry_the_key_too() -> None:
    observer = KeyedObserver()
    rule = Rule("down", "100/min", on_error="allow")
    with Limiter(f"redis://127.0.0.1:{free_port()}/0", timeout=0.5, breaker=False, observer=observer) as limiter:
        limiter.try_acquire(rule, "one")
        limiter.try_acquire_many([(rule, "two"), (rule, "three")])
        limiter.charge(rule, "four", 130)
        assert not limiter.refund(rule, "four", 10)  # failed and dropped: nothing given back
    assert ["one", "two", "three"] == observer.keys
    assert [("down", 130, -30, "four")] == observer.charges
    assert [] == observer.refunds


@pytest.mark.redis
def test_an_over_limit_cache_hit_carries_the_key(key_prefix: str) -> None:
    observer = KeyedObserver()
    rule = Rule(f"{key_prefix}-olc", "1/10s", algorithm="gcra")
    with Limiter("redis://127.0.0.1:6379/0", observer=observer, over_limit_cache=True) as limiter:
        assert limiter.try_acquire(rule, "abuser")
        assert not limiter.try_acquire(rule, "abuser")
        calls = observer.store_calls
        assert not limiter.try_acquire(rule, "abuser")  # answered by the cache
        assert calls == observer.store_calls
        assert limiter.over_limit_cache is not None and 1 == limiter.over_limit_cache.hits
    assert ["abuser"] * 3 == observer.keys


def test_wants_keys_must_be_true_itself_not_merely_truthy() -> None:
    """A ``wants_keys`` that is some other object (a method, a Mock's attribute) does not
    change how ``decided`` is called."""

    class Truthy(ThreeMethods):
        wants_keys: Any = "yes"

    observer = Truthy()
    with Limiter("memory://", observer=observer) as limiter:
        limiter.try_acquire(TOKENS, f"k-{uuid.uuid4().hex}")
    assert 1 == len(observer.decisions)
