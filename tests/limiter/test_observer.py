"""The observer seam: a limiter reports each decision, each store call and each breaker change."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from ratekeeper import AsyncLimiter, Decision, Limiter, Op, Rule, StoreError, StoreTimeout
from ratekeeper.algorithms.base import Plan
from ratekeeper.limiter.breaker import CLOSED, OPEN, CircuitBreaker
from ratekeeper.limiter.store_wrappers import ObservedStore
from ratekeeper.limiter.store_wrappers_async import AsyncObservedStore
from ratekeeper.stores.base import InProcessAsync
from ratekeeper.stores.memory import MemoryStore
from ratekeeper.testing import FakeClock, RecordingObserver

RULE = Rule("obs", ["2/s"], algorithm="fixed_window")
BOUNCE = Rule("obs.bounce", ["2/s"], algorithm="fixed_window", on_error="allow")


class DownStore:
    """A store that always fails (after counting the call)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls = 0

    def _fail(self) -> None:
        self.calls += 1
        raise StoreTimeout("the store did not answer")

    def decide(self, op: Op, now: int | None = None) -> Decision:
        self._fail()
        raise AssertionError("unreachable")

    def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        self._fail()
        raise AssertionError("unreachable")

    def refund(self, op: Op, now: int | None = None) -> None:
        self._fail()

    def reset(self, plan: Plan, key: str) -> None:
        self._fail()

    def close(self) -> None:
        pass


def test_without_an_observer_the_limiter_calls_its_store_directly() -> None:
    """Nothing is paid unattached: no wrapper between the limiter and its store."""
    limiter = Limiter()
    assert isinstance(limiter.store, MemoryStore)
    assert limiter._direct == limiter.store.decide_fields
    alimiter = AsyncLimiter()
    assert isinstance(alimiter.store, InProcessAsync)
    assert alimiter._direct == alimiter.store.sync.decide_fields


def test_each_charging_decision_and_store_call_is_reported_but_not_peeks() -> None:
    observer = RecordingObserver()
    limiter = Limiter(clock=FakeClock(), observer=observer)
    assert isinstance(limiter.store, ObservedStore)
    got = [limiter.try_acquire(RULE, "k") for _ in range(3)]
    limiter.peek(RULE, "k")
    batch = limiter.try_acquire_many([(RULE, "a"), (RULE, "b")])
    limiter.refund(RULE, "a")
    limiter.reset(RULE, "b")
    assert [*got, *batch] == observer.decisions
    assert [True, True, False, True, True] == [d.allowed for d in observer.decisions]
    # three decisions, a peek, a batch, a refund and a reset: seven store calls, none failed
    assert 7 == len(observer.store_calls)
    assert all(seconds >= 0 and error is None for seconds, error in observer.store_calls)


def test_a_failing_store_reports_the_error_the_fallback_and_the_breaker() -> None:
    clock = FakeClock()
    observer = RecordingObserver()
    store = DownStore(clock)
    limiter = Limiter(store, observer=observer, breaker=CircuitBreaker(failures=2, cool_down=1.0, clock=clock))
    decisions = [limiter.try_acquire(BOUNCE, "k") for _ in range(3)]
    assert ["allow"] * 3 == [d.fallback for d in decisions]
    assert decisions == observer.decisions  # fallback decisions are decisions too
    assert 2 == store.calls  # the third was answered by the open breaker, without a store call
    assert [StoreTimeout, StoreTimeout] == [type(error) for _, error in observer.store_calls]
    assert [(CLOSED, OPEN)] == observer.breaker_changes


def test_acquire_reports_each_decision_it_makes() -> None:
    clock = FakeClock()
    observer = RecordingObserver()
    limiter = Limiter(clock=clock, observer=observer)
    rule = Rule("obs.wait", ["1/s"], algorithm="gcra")
    limiter.try_acquire(rule, "k")
    waited = limiter.acquire(rule, "k", timeout=5)
    assert waited.allowed and waited.delay > 0  # a reservation: one store call, then a sleep
    assert 2 == len(observer.decisions)
    assert waited == observer.decisions[-1]


def test_async_limiter_reports_the_same_as_the_blocking_one() -> None:
    observer = RecordingObserver()

    async def main() -> list[Decision]:
        async with AsyncLimiter(clock=FakeClock(), observer=observer) as limiter:
            assert isinstance(limiter.store, AsyncObservedStore)
            assert limiter._direct is None  # observed: the long way round
            got = [await limiter.try_acquire(RULE, "k") for _ in range(3)]
            await limiter.peek(RULE, "k")
            return got

    got = asyncio.run(main())
    assert got == observer.decisions
    assert 4 == len(observer.store_calls)


def test_in_process_async_store_decides_without_a_coroutine_in_between() -> None:
    """``AsyncLimiter`` on memory calls the memory store itself: the same decisions as the
    blocking limiter, and a guarded (breaker) route still goes through the store wrapper."""
    clock = FakeClock()
    limiter = Limiter(clock=clock)

    async def main() -> list[Decision]:
        alimiter = AsyncLimiter(clock=clock)
        got = [await alimiter.try_acquire(RULE, "k") for _ in range(3)]
        alimiter._route(True)
        assert alimiter._direct is None
        alimiter._route(False)
        assert alimiter._direct is not None
        return got

    assert [limiter.try_acquire(RULE, "k") for _ in range(3)] == asyncio.run(main())


@pytest.mark.parametrize("error", [None, StoreError("boom")])
def test_observed_store_passes_calls_through(error: StoreError | None) -> None:
    """The wrapper changes nothing but the reports: same answers, same errors."""
    observer = RecordingObserver()
    clock = FakeClock()
    inner: MemoryStore | DownStore = MemoryStore(clock=clock) if error is None else DownStore(clock)
    store = ObservedStore(inner, observer)
    op = Op.decide(RULE.plan, "k")
    if error is None:
        assert store.decide(op).allowed
        assert 1 == len(observer.decisions)
    else:
        with pytest.raises(StoreError):
            store.decide(op)
        assert [] == observer.decisions
    assert 1 == len(observer.store_calls)


def test_the_recording_observer_keeps_charges_and_refunds_apart_from_decisions() -> None:
    clock = FakeClock()
    observer = RecordingObserver()
    limiter = Limiter(MemoryStore(clock=clock), observer=observer)
    assert limiter.try_acquire(RULE, "k").allowed
    debt = limiter.charge(RULE, "k", 3)
    assert limiter.refund(RULE, "k", 2)
    assert 1 == len(observer.decisions)
    assert [(debt, 3)] == observer.charges
    assert debt.remaining < 0
    assert [("obs", 2)] == observer.refunds
