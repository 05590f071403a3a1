"""Regressions found by review: each test pins the fixed behaviour; its docstring tells the bug."""

from __future__ import annotations

import asyncio
import math
import time
from enum import StrEnum

import pytest

from ratekeeper import AsyncLimiter, InvalidRequest, Limiter, Quota, Rule
from ratekeeper.stores.memory import MemoryStore
from ratekeeper.testing import FakeClock

# -- memory store: reservations dropped by the expiry sweep ----------------------------


def test_reservation_survives_sweep_after_key_moves_generation() -> None:
    """Bug: a key's reservation hold stays with the generation it was made in, not with the key.

    acquire() reserves slots far beyond the rule's horizon (stripe.young_hold). A sweep
    sets the young generation aside (old_hold keeps the hold); a later refused
    try_acquire on the key moves it back to the young generation (store) *without* its
    hold, so the next sweep drops the key while its state is not whole: the queued
    reservations are forgotten and the key is admitted a full burst again (over-admission).
    Default store settings.
    """
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    rule = Rule("r", ["10/s"], algorithm="gcra")  # horizon 1 s
    assert limiter.try_acquire(rule, "k", 10)
    for _ in range(5):  # five acquire() callers each reserve the next slot: the last runs at +5 s
        d = limiter.store.decide(rule.plan, "k", 10, max_wait=10_000_000)
        assert d.allowed and d.delay > 0
    clock.advance(1.1)
    limiter.try_acquire(rule, "other")  # runs the sweep: k's generation is set aside
    assert not limiter.try_acquire(rule, "k", 10)  # refused; k moves to the young generation
    clock.advance(1.1)
    limiter.try_acquire(rule, "other")  # runs the sweep again
    # Reservations are booked until +6 s; at +2.2 s a further 10 must still be refused.
    assert not limiter.try_acquire(rule, "k", 10)


def test_reservation_survives_sweep_when_its_store_rotates_the_generation() -> None:
    """Bug: MemoryStore.decide calls stripe.store() (which may rotate young -> old) and only
    then stripe.hold(), so the hold lands on the new, empty young generation while the key
    sits in the old one with an old_hold that does not cover the reservation. The sweep
    then drops the key one horizon later although its reservation reaches further."""
    clock = FakeClock()
    store = MemoryStore(max_keys=4, stripes=1, clock=clock)  # 2 keys per generation
    limiter = Limiter(store)
    rule = Rule("r", ["10/s"], algorithm="gcra")  # horizon 1 s
    assert limiter.try_acquire(rule, "b", 10)
    limiter.try_acquire(rule, "a")  # young {b, a} is full: rotates to old
    limiter.try_acquire(rule, "c")  # young {c}
    d = store.decide(rule.plan, "b", 10, max_wait=5_000_000)  # b moves to young -> full -> rotates
    assert d.allowed and d.delay_us == 1_000_000  # b's next slot is booked until +2 s
    clock.advance(1.5)
    limiter.try_acquire(rule, "zzz")  # runs the sweep
    assert not limiter.try_acquire(rule, "b", 10), "b's reservation was forgotten by the sweep"


# -- memory store: try_acquire_many ----------------------------------------------------


def test_cost_zero_batch_stores_nothing() -> None:
    """Bug: decide_many stores every item's state when all are admitted, even an unchanged
    None for a never-seen key checked with cost 0. README: "A request of cost 0 stores
    nothing"; these empty entries count against max_keys and evict real, charged keys."""
    limiter = Limiter(clock=FakeClock())
    rule = Rule("r", ["10/s"])
    assert limiter.try_acquire_many([(rule, "probe", 0)])
    assert limiter.store.key_count() == 0


def test_try_acquire_many_alone_lets_idle_keys_expire() -> None:
    """Bug: MemoryStore.decide_many never runs the once-a-second sweep (only decide does),
    so an application that only uses try_acquire_many never expires idle keys: memory
    grows to max_keys instead of staying proportional to active keys."""
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    rule = Rule("r", ["1000/s"])  # horizon 1 s
    for i in range(100):
        assert limiter.try_acquire_many([(rule, f"user-{i}"), (rule, "*")])
    for _ in range(5):  # every key is whole after 1 s; go well past two horizons
        clock.advance(2)
        limiter.try_acquire_many([(rule, "*")])
    assert limiter.store.key_count() <= 1


# -- quotas that change a key's limits -------------------------------------------------


def _quota_limiter(answer: str) -> tuple[FakeClock, Quota, Limiter]:
    clock = FakeClock()
    quota = Quota(lambda key: [answer], ttl=3600, clock=clock)
    return clock, quota, Limiter(clock=clock)


def test_gcra_quota_with_other_scale_does_not_lock_key_out() -> None:
    """Bug: the GCRA state (tat) is kept in units of 1/d us, d depending on the limit
    (3/s -> d=3, 10/s -> d=1), but a quota answer with the same number of limits shares
    the storage table and reads the old tat in the new units: one request under the
    failsafe 3/s, then quota 10/s, locks the key out for ~2 x the clock's value
    (here ~2000 s; with the monotonic clock, twice the machine's uptime)."""
    clock, quota, limiter = _quota_limiter("10/s")
    rule = Rule("api", ["3/s"], algorithm="gcra", quota=quota)
    try:
        assert limiter.try_acquire(rule, "k")  # failsafe 3/s; starts the lookup
        assert quota.wait_idle()
        clock.advance(5)  # idle far longer than either period
        d = limiter.try_acquire(rule, "k")
        assert d.allowed, d
    finally:
        quota.close()


def test_fixed_window_quota_with_other_period_rolls_its_window() -> None:
    """Bug: fixed-window state holds the window *number* (now // period). After a quota
    changes the period (10/s -> 100/minute) the old number (from the 1 s grid) is larger
    than the new one and is taken for "the clock stepped back": the key stays in window
    1000 of the 60 s grid, ~16 hours away, so 100/minute becomes 100 per 16 hours."""
    clock, quota, limiter = _quota_limiter("100/minute")
    rule = Rule("api", ["10/s"], algorithm="fixed_window", quota=quota)
    try:
        assert limiter.try_acquire(rule, "k")
        assert quota.wait_idle()
        d = limiter.try_acquire(rule, "k", 99)
        assert d.allowed
        assert d.reset_after <= 60, d
        clock.advance(61)
        assert limiter.try_acquire(rule, "k"), "a new minute must admit again"
    finally:
        quota.close()


def test_quota_lookup_cancelled_with_its_loop_is_not_pending_forever() -> None:
    """Bug: an async provider's lookup runs as a task on the caller's loop; when the task is
    cancelled (e.g. asyncio.run() ends) Quota._fetch_async catches only Exception, so
    neither _answered nor _failed runs and the key stays in Quota._pending forever: it is
    never looked up again (stuck on the failsafe), it holds one of max_pending slots for
    good, wait_idle() never succeeds and drain() on a later loop crashes."""
    clock = FakeClock()

    async def slow_provider(key: str) -> list[str]:
        await asyncio.sleep(3600)
        return ["1/s"]

    quota = Quota(slow_provider, clock=clock)
    rule = Rule("api", ["5/s"], quota=quota)

    async def once() -> None:
        async with AsyncLimiter(clock=clock) as limiter:
            await limiter.try_acquire(rule, "k")

    asyncio.run(once())  # the lookup task is cancelled when the loop shuts down
    assert quota.wait_idle(timeout=0.5), f"lookup still pending: {quota._pending}"


# -- acquire / decorator / lease -------------------------------------------------------


@pytest.mark.parametrize("timeout", [math.inf, math.nan])
def test_acquire_with_non_finite_timeout_is_handled(timeout: float) -> None:
    """Bug: check_timeout accepts inf and NaN (floats, not < 0) and acquire_flow then does
    round(timeout * 1_000_000): OverflowError / bare ValueError ("cannot convert float
    infinity to integer"), even on a key with free capacity. inf should mean "no limit"
    (like None) or be refused with InvalidRequest; NaN must be InvalidRequest."""
    limiter = Limiter(clock=FakeClock())
    rule = Rule("r", ["10/s"])
    try:
        d = limiter.acquire(rule, "k", timeout=timeout)
    except InvalidRequest:
        return
    assert d.allowed


def test_sync_limiter_decorator_with_wait_does_not_block_event_loop() -> None:
    """Bug: Limiter.limit(..., wait=s) on an async function calls the blocking
    Limiter.acquire inside the coroutine, which time.sleep()s: every other task on the
    event loop is frozen for up to `wait` seconds. (docs/choices.md says calling the
    memory store from a coroutine is fine; waiting with time.sleep is not.)"""
    limiter = Limiter()
    rule = Rule("export", ["1/300ms"])

    @limiter.limit(rule, wait=2.0)
    async def export() -> int:
        return 1

    async def main() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        start = time.monotonic()
        await export()
        await export()  # waits ~0.3 s for its turn
        elapsed = time.monotonic() - start
        task.cancel()
        assert elapsed > 0.2
        return ticks

    assert asyncio.run(main()) >= 5, "the event loop was blocked while the decorator waited"


def test_reused_lease_context_manager_releases_its_slot() -> None:
    """Bug: _LeaseBase.released is set on the first exit and never cleared when the same
    Lease is entered again (_granted only replaces decision), so the second `with lease:`
    takes a slot and never releases it: the slot leaks until the lease expires (here 5
    minutes). Re-entering should either release on exit or raise."""
    limiter = Limiter(clock=FakeClock())
    jobs = Rule("jobs", ["1/5minutes"], algorithm="concurrency")
    lease = limiter.lease(jobs, "tenant")
    with lease:
        pass
    with lease:
        pass
    assert limiter.try_acquire(jobs, "tenant"), "the second use of the lease was never released"


# -- error messages --------------------------------------------------------------------


class Tier(StrEnum):
    GOLD = "gold"


def test_str_subclass_key_error_does_not_blame_the_cost() -> None:
    """Bug: check() requires `type(key) is str`, but bad_call() tests `isinstance(key, str)`,
    so a str subclass (StrEnum member) passes every key check in bad_call and falls
    through to the last line: "cost must be a non-negative integer, got 1" for a call whose
    cost is fine. Either accept str subclasses or say the key is the problem."""
    limiter = Limiter(clock=FakeClock())
    rule = Rule("r", ["10/s"])
    try:
        limiter.try_acquire(rule, Tier.GOLD)
    except InvalidRequest as exc:
        assert "cost" not in str(exc), str(exc)
