"""The over-limit cache (``ratekeeper.limiter.overlimit``) on the real Redis: a key's denial
is answered in process until its ``retry_after`` has passed, and the cache never admits."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.limiter.overlimit import DenialCache
from ratekeeper.testing import FakeClock, RecordingObserver

pytestmark = pytest.mark.redis

URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def rule() -> Rule:
    return Rule(f"olc-{uuid.uuid4().hex[:8]}", ["2/10s"], algorithm="gcra")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def setup(clock: FakeClock) -> Iterator[tuple[Limiter, RecordingObserver, DenialCache]]:
    observer = RecordingObserver()
    cache = DenialCache(clock)
    limiter = Limiter(URL, observer=observer, over_limit_cache=cache)
    yield limiter, observer, cache
    limiter.close()


def test_a_flood_from_one_key_costs_one_store_call_until_retry_after(
    setup: tuple[Limiter, RecordingObserver, DenialCache], rule: Rule, clock: FakeClock
) -> None:
    limiter, observer, cache = setup
    assert limiter.try_acquire(rule, "abuser") and limiter.try_acquire(rule, "abuser")
    first = limiter.try_acquire(rule, "abuser")
    assert not first
    calls = len(observer.store_calls)
    denials = [limiter.try_acquire(rule, "abuser") for _ in range(50)]
    assert calls == len(observer.store_calls)  # none of the 50 reached Redis
    assert 50 == cache.hits
    assert all(not d for d in denials)
    assert {first.denied_by} == {d.denied_by for d in denials}
    assert 52 + 1 == len(observer.decisions)  # hits are reported like any decision

    clock.advance(1.0)
    later = limiter.try_acquire(rule, "abuser")
    assert pytest.approx(first.retry_after - 1.0, abs=1e-6) == later.retry_after
    assert calls == len(observer.store_calls)

    clock.advance(first.retry_after)  # the store's promise has run out: ask it again
    limiter.try_acquire(rule, "abuser")
    assert calls + 1 == len(observer.store_calls)


def test_another_key_and_a_smaller_cost_still_go_to_the_store(
    setup: tuple[Limiter, RecordingObserver, DenialCache], rule: Rule
) -> None:
    limiter, observer, _ = setup
    assert limiter.try_acquire(rule, "a", 2)
    assert not limiter.try_acquire(rule, "a", 2)
    calls = len(observer.store_calls)
    assert not limiter.try_acquire(rule, "a", 3)  # a larger cost: refused here
    assert calls == len(observer.store_calls)
    limiter.try_acquire(rule, "a", 1)  # smaller than the cached denial's cost: the store decides
    assert limiter.try_acquire(rule, "b")
    assert calls + 2 == len(observer.store_calls)


def test_a_refund_or_reset_through_the_limiter_forgets_the_denial(
    setup: tuple[Limiter, RecordingObserver, DenialCache], rule: Rule
) -> None:
    limiter, _, _ = setup
    assert limiter.try_acquire(rule, "k", 2)
    assert not limiter.try_acquire(rule, "k")
    limiter.refund(rule, "k", 1)
    assert limiter.try_acquire(rule, "k")  # admitted: the cache did not stand in the way
    assert not limiter.try_acquire(rule, "k")
    limiter.reset(rule, "k")
    assert limiter.try_acquire(rule, "k")


def test_peeks_reservations_and_leases_are_never_answered_from_the_cache(clock: FakeClock) -> None:
    observer = RecordingObserver()
    limiter = Limiter(URL, observer=observer, over_limit_cache=DenialCache(clock))
    name = f"olc-{uuid.uuid4().hex[:8]}"
    jobs = Rule(name + "-jobs", ["1/10s"], algorithm="concurrency")
    gcra = Rule(name, ["1/10s"], algorithm="gcra")
    try:
        assert limiter.try_acquire(jobs, "t")
        assert not limiter.try_acquire(jobs, "t")
        assert not limiter.try_acquire(jobs, "t")
        assert limiter.try_acquire(gcra, "t")
        assert not limiter.try_acquire(gcra, "t")
        calls = len(observer.store_calls)
        assert not limiter.peek(gcra, "t")
        assert calls + 1 == len(observer.store_calls)
        assert limiter.over_limit_cache is not None
        assert 0 == limiter.over_limit_cache.hits  # the second concurrency refusal went to Redis too
    finally:
        limiter.close()


def test_the_cache_is_bounded_and_drops_its_oldest_entry_first(rule: Rule, clock: FakeClock) -> None:
    cache = DenialCache(clock, max_keys=2)
    limiter = Limiter(URL, over_limit_cache=cache)
    try:
        for key in ("a", "b", "c"):
            limiter.try_acquire(rule, key, 2)
            assert not limiter.try_acquire(rule, key)
        assert {"b", "c"} == {key for _, key in cache.entries}
    finally:
        limiter.close()


def test_the_memory_store_needs_no_cache() -> None:
    """The memory store decides in process: no cache in front of it, its fast path stays."""
    limiter = Limiter("memory://", over_limit_cache=True)
    assert limiter.over_limit_cache is None


def test_the_async_limiter_answers_a_flood_from_the_cache(rule: Rule, clock: FakeClock) -> None:
    async def main() -> None:
        observer = RecordingObserver()
        async with AsyncLimiter(URL, observer=observer, over_limit_cache=DenialCache(clock)) as limiter:
            assert await limiter.try_acquire(rule, "k", 2)
            assert not await limiter.try_acquire(rule, "k")
            calls = len(observer.store_calls)
            results = await asyncio.gather(*(limiter.try_acquire(rule, "k") for _ in range(20)))
            assert not any(results)
            assert calls == len(observer.store_calls)

    asyncio.run(main())
