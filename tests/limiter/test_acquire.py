"""``acquire``: waiting for admission on the clock, fairly, and never keeping what it will not use.

Token bucket, GCRA and leaky bucket reserve the next free slot in one store call and
sleep until it; the other algorithms sleep until ``retry_after`` (or poll with backoff,
for leases) and ask again. Every wait goes through an injected clock: no test sleeps.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from typing import Any

import pytest

from ratekeeper import ALGORITHMS, AsyncLimiter, InvalidRequest, Limit, Limiter, RateLimitExceeded, Rule
from ratekeeper.testing import FakeClock

RESERVING = ["token_bucket", "gcra", "leaky_bucket"]
PERIOD = 2.0
"""Every reserving rule below admits one unit every ``PERIOD`` seconds."""


def reserving_rule(algorithm: str) -> Rule:
    """1 per 2 s; the leaky bucket's queue holds 10 so that it can queue (admit with a delay)."""
    burst = 10 if algorithm == "leaky_bucket" else None
    return Rule(f"reserve.{algorithm}", "1/2s", algorithm, burst=burst)


class StillClock(FakeClock):
    """Records sleeps without moving time: every acquirer arrives at the same instant."""

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


class InterruptingClock(FakeClock):
    """A sleep that is interrupted (Ctrl-C) as soon as it starts."""

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        raise KeyboardInterrupt


class GatedClock(FakeClock):
    """``asleep`` waits on a real ``asyncio.Event``, so the sleeping task can be cancelled there."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeping: asyncio.Event | None = None
        self.gate: asyncio.Event | None = None

    async def asleep(self, seconds: float) -> None:
        assert self.sleeping is not None
        assert self.gate is not None
        self.slept.append(seconds)
        self.sleeping.set()
        await self.gate.wait()
        self.advance(seconds)


class HookClock(FakeClock):
    """A FakeClock that runs ``hook`` right after its ``at``-th sleep (another holder acting meanwhile)."""

    def __init__(self, at: int, hook: Callable[[], None]) -> None:
        super().__init__()
        self.at = at
        self.hook = hook

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if len(self.slept) == self.at:
            self.hook()


def count_decides(monkeypatch: pytest.MonkeyPatch, limiter: Limiter) -> list[tuple[Any, ...]]:
    """Wrap ``limiter.store.decide``; the returned list grows by one per store call."""
    calls: list[tuple[Any, ...]] = []
    decide = limiter.store.decide

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return decide(*args, **kwargs)

    monkeypatch.setattr(limiter.store, "decide", counting)
    return calls


# --------------------------------------------------------------------------- reservations


@pytest.mark.parametrize("algorithm", RESERVING)
def test_acquire_reserves_in_one_store_call_and_sleeps_exactly_until_the_slot(
    monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    rule = reserving_rule(algorithm)
    limiter.try_acquire(rule, "k")
    calls = count_decides(monkeypatch, limiter)
    start = clock.now_us()

    decision = limiter.acquire(rule, "k")

    assert 1 == len(calls)
    assert [PERIOD] == clock.slept
    assert 2_000_000 == clock.now_us() - start
    assert (True, PERIOD) == (decision.allowed, decision.delay)


@pytest.mark.parametrize("algorithm", RESERVING)
def test_acquire_with_a_free_slot_does_not_sleep(monkeypatch: pytest.MonkeyPatch, algorithm: str) -> None:
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    calls = count_decides(monkeypatch, limiter)
    decision = limiter.acquire(reserving_rule(algorithm), "k")
    assert (True, 0.0, [], 1) == (decision.allowed, decision.delay, clock.slept, len(calls))


@pytest.mark.parametrize("algorithm", RESERVING)
def test_async_acquire_reserves_in_one_store_call_and_sleeps_exactly_until_the_slot(
    monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    clock = FakeClock()
    limiter = AsyncLimiter(clock=clock)
    rule = reserving_rule(algorithm)
    calls: list[tuple[Any, ...]] = []
    decide = limiter.store.decide

    async def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return await decide(*args, **kwargs)

    async def main() -> None:
        await limiter.try_acquire(rule, "k")
        monkeypatch.setattr(limiter.store, "decide", counting)
        decision = await limiter.acquire(rule, "k")
        assert (True, PERIOD) == (decision.allowed, decision.delay)

    asyncio.run(main())
    assert 1 == len(calls)
    assert [PERIOD] == clock.slept


@pytest.mark.parametrize("algorithm", RESERVING)
def test_acquirers_in_sequence_are_served_first_come_first_served(algorithm: str) -> None:
    """Five callers arriving at the same instant get the slots 0, T, 2T, 3T, 4T in order."""
    clock = StillClock()
    limiter = Limiter(clock=clock)
    rule = reserving_rule(algorithm)
    delays = [limiter.acquire(rule, "k").delay for _ in range(5)]
    assert [0.0, 2.0, 4.0, 6.0, 8.0] == delays
    assert [2.0, 4.0, 6.0, 8.0] == clock.slept


@pytest.mark.parametrize("algorithm", RESERVING)
def test_concurrent_acquirers_each_get_their_own_slot(algorithm: str) -> None:
    """Eight threads reserving at one instant get eight distinct slots: 0, T, ..., 7T."""
    clock = StillClock()
    limiter = Limiter(clock=clock)
    rule = reserving_rule(algorithm)
    delays: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def acquirer() -> None:
        start.wait()
        delay = limiter.acquire(rule, "k").delay
        with lock:
            delays.append(delay)

    threads = [threading.Thread(target=acquirer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [2.0 * i for i in range(8)] == sorted(delays)


@pytest.mark.parametrize("algorithm", RESERVING)
def test_timeout_shorter_than_the_wait_raises_at_once_and_reserves_nothing(
    monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    rule = reserving_rule(algorithm)
    limiter.try_acquire(rule, "k")
    before = limiter.peek(rule, "k", 0)
    calls = count_decides(monkeypatch, limiter)
    start = clock.now_us()

    with pytest.raises(RateLimitExceeded) as excinfo:
        limiter.acquire(rule, "k", timeout=1.5)

    assert "not admitted within the timeout of 1.5s" in str(excinfo.value)
    assert excinfo.value.retry_after > 0
    assert ([], 0, 1) == (clock.slept, clock.now_us() - start, len(calls))
    assert before == limiter.peek(rule, "k", 0)


@pytest.mark.parametrize("algorithm", RESERVING)
def test_timeout_zero_on_a_busy_key_raises_and_reserves_nothing(algorithm: str) -> None:
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    rule = reserving_rule(algorithm)
    limiter.try_acquire(rule, "k")
    before = limiter.peek(rule, "k", 0)
    with pytest.raises(RateLimitExceeded):
        limiter.acquire(rule, "k", timeout=0)
    assert ([], before) == (clock.slept, limiter.peek(rule, "k", 0))


@pytest.mark.parametrize("algorithm", RESERVING)
def test_timeout_equal_to_the_wait_is_enough(algorithm: str) -> None:
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    rule = reserving_rule(algorithm)
    limiter.try_acquire(rule, "k")
    assert True is limiter.acquire(rule, "k", timeout=PERIOD).allowed
    assert [PERIOD] == clock.slept


@pytest.mark.parametrize("algorithm", RESERVING)
def test_sync_acquire_interrupted_while_sleeping_gives_the_reservation_back(algorithm: str) -> None:
    clock = InterruptingClock()
    limiter = Limiter(clock=clock)
    rule = reserving_rule(algorithm)
    limiter.try_acquire(rule, "k")
    before = limiter.peek(rule, "k", 0)

    with pytest.raises(KeyboardInterrupt):
        limiter.acquire(rule, "k")

    assert [PERIOD] == clock.slept  # it did reserve, then was interrupted while sleeping
    assert before == limiter.peek(rule, "k", 0)


@pytest.mark.parametrize("algorithm", RESERVING)
def test_async_acquire_cancelled_while_sleeping_gives_the_reservation_back(algorithm: str) -> None:
    clock = GatedClock()
    limiter = AsyncLimiter(clock=clock)
    rule = reserving_rule(algorithm)

    async def main() -> None:
        clock.sleeping, clock.gate = asyncio.Event(), asyncio.Event()
        await limiter.try_acquire(rule, "k")
        before = await limiter.peek(rule, "k", 0)
        task = asyncio.create_task(limiter.acquire(rule, "k"))
        await clock.sleeping.wait()
        assert before != await limiter.peek(rule, "k", 0)  # the slot is reserved while it sleeps
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert before == await limiter.peek(rule, "k", 0)

    asyncio.run(main())
    assert [PERIOD] == clock.slept


# --------------------------------------------------------------------------- the other algorithms


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_log"])
def test_acquire_on_a_window_sleeps_retry_after_and_succeeds(monkeypatch: pytest.MonkeyPatch, algorithm: str) -> None:
    clock = FakeClock(start_us=3_000_000_000)  # on a 3 s window boundary
    limiter = Limiter(clock=clock)
    rule = Rule(f"window.{algorithm}", "2/3s", algorithm)
    limiter.try_acquire(rule, "k", 2)
    clock.advance(1)
    assert 2.0 == limiter.peek(rule, "k").retry_after
    calls = count_decides(monkeypatch, limiter)

    decision = limiter.acquire(rule, "k")

    assert [2.0] == clock.slept
    assert (True, 1) == (decision.allowed, decision.remaining)
    assert 2 == len(calls)  # refused, slept retry_after, admitted


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_log"])
def test_acquire_on_a_window_with_a_shorter_timeout_raises_without_sleeping(algorithm: str) -> None:
    clock = FakeClock(start_us=3_000_000_000)
    limiter = Limiter(clock=clock)
    rule = Rule(f"window.{algorithm}", "2/3s", algorithm)
    limiter.try_acquire(rule, "k", 2)
    before = limiter.peek(rule, "k", 0)
    with pytest.raises(RateLimitExceeded) as excinfo:
        limiter.acquire(rule, "k", timeout=2.9)
    assert (3.0, []) == (excinfo.value.retry_after, clock.slept)
    assert before == limiter.peek(rule, "k", 0)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_acquire_of_a_cost_beyond_capacity_raises_at_once_instead_of_waiting_forever(algorithm: str) -> None:
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    with pytest.raises(RateLimitExceeded) as excinfo:
        limiter.acquire(Rule("r", "5/s", algorithm), "k", 6)
    assert (math.inf, Limit(5, 1), []) == (excinfo.value.retry_after, excinfo.value.decision.denied_by, clock.slept)


@pytest.mark.parametrize("timeout", [-1, -0.5, "1", True])
def test_acquire_refuses_a_bad_timeout(timeout: object) -> None:
    limiter = Limiter(clock=FakeClock())
    with pytest.raises(InvalidRequest) as excinfo:
        limiter.acquire(Rule("r", "5/s"), "k", timeout=timeout)  # type: ignore[arg-type]
    assert "timeout must be None" in str(excinfo.value)


# --------------------------------------------------------------------------- concurrency


def test_acquire_on_concurrency_polls_with_backoff_until_a_lease_is_released() -> None:
    rule = Rule("jobs", "1/30s", "concurrency")
    holder: dict[str, Any] = {}

    def release_held() -> None:
        holder["limiter"].release(rule, "k", holder["lease_id"])

    clock = HookClock(at=4, hook=release_held)
    limiter = Limiter(clock=clock)
    holder["limiter"] = limiter
    holder["lease_id"] = limiter.try_acquire(rule, "k").lease_id

    decision = limiter.acquire(rule, "k", timeout=10)

    assert [0.001, 0.002, 0.004, 0.008] == clock.slept
    assert True is decision.allowed
    assert decision.lease_id not in (None, holder["lease_id"])
    assert 0 == limiter.peek(rule, "k", 0).remaining


def test_acquire_on_concurrency_gives_up_after_the_timeout_with_capped_backoff() -> None:
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    rule = Rule("jobs", "1/30s", "concurrency")
    limiter.try_acquire(rule, "k")
    with pytest.raises(RateLimitExceeded):
        limiter.acquire(rule, "k", timeout=0.5)
    assert [0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.05] == clock.slept[:7]
    assert 0.05 == max(clock.slept)
    assert sum(clock.slept) <= 0.5
    assert 0 == limiter.peek(rule, "k", 0).remaining  # the waiter took nothing


def test_acquire_on_concurrency_admits_once_a_crashed_holders_lease_expires() -> None:
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    rule = Rule("jobs", "1/30s", "concurrency")
    limiter.try_acquire(rule, "k")  # never released
    start = clock.now_us()
    assert True is limiter.acquire(rule, "k").allowed
    assert 30_000_000 <= clock.now_us() - start <= 30_050_000


def test_lease_with_a_timeout_waits_for_a_release() -> None:
    rule = Rule("jobs", "1/30s", "concurrency")
    clock = HookClock(at=3, hook=lambda: None)
    limiter = Limiter(clock=clock)
    clock.hook = limiter.lease(rule, "k").__enter__().release  # the holder leaves during the 3rd poll
    with limiter.lease(rule, "k", timeout=1.0) as lease:
        assert isinstance(lease.id, str)
        assert 0 == limiter.peek(rule, "k", 0).remaining
    assert [0.001, 0.002, 0.004] == clock.slept
    assert 1 == limiter.peek(rule, "k", 0).remaining


@pytest.mark.parametrize("timeout", [math.inf, math.nan])
def test_acquire_with_non_finite_timeout_is_handled(timeout: float) -> None:
    """acquire(timeout=inf) waits as long as it takes (as None does) and timeout=NaN is
    refused with InvalidRequest: neither reaches the waiting logic as a number it cannot
    round."""
    limiter = Limiter(clock=FakeClock())
    rule = Rule("r", ["10/s"])
    try:
        d = limiter.acquire(rule, "k", timeout=timeout)
    except InvalidRequest:
        return
    assert d.allowed


def test_reused_lease_context_manager_releases_its_slot() -> None:
    """A Lease entered a second time releases its slot on the second exit too (a leaked slot
    would stay taken until the lease expires, here 5 minutes)."""
    limiter = Limiter(clock=FakeClock())
    jobs = Rule("jobs", ["1/5minutes"], algorithm="concurrency")
    lease = limiter.lease(jobs, "tenant")
    with lease:
        pass
    with lease:
        pass
    assert limiter.try_acquire(jobs, "tenant"), "the second use of the lease was never released"
