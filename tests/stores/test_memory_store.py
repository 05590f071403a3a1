"""The memory store: exact under threads and asyncio, bounded by ``max_keys`` with LRU
eviction, and holding no key whose state is whole.

The clock is a ``FakeClock`` that moves only when told, so "exact" means exact: with
time standing still an exact algorithm admits precisely its limit, never one more.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from ratekeeper import AsyncLimiter, ConfigurationError, Limiter, MemoryStore, Rule
from ratekeeper.op import Op
from ratekeeper.testing import FakeClock

EXACT = ["fixed_window", "sliding_window_log", "token_bucket", "gcra", "leaky_bucket", "concurrency"]
COUNTING = ["fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "gcra", "leaky_bucket"]
THREADS = 8


@contextmanager
def frequent_thread_switches() -> Iterator[None]:
    """Make the interpreter switch threads far more often, to shake out races."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def run_together(worker: Callable[[int], None]) -> None:
    """Run ``worker(i)`` on ``THREADS`` threads at once, switching between them often."""
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    with frequent_thread_switches():
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def hammer(limiter: Limiter, rule: Rule, key: str, costs: Callable[[int, int], int], tries: int) -> list[int]:
    """``THREADS`` threads, started together, each trying ``tries`` times; the cost each thread had admitted."""
    admitted = [0] * THREADS
    start = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            start.wait()
            total = 0
            for attempt in range(tries):
                cost = costs(index, attempt)
                if limiter.try_acquire(rule, key, cost):
                    total += cost
            admitted[index] = total
        except BaseException as exc:  # noqa: BLE001 - handed to the test below
            errors.append(exc)

    run_together(worker)
    assert [] == errors
    return admitted


# --------------------------------------------------------------------------- exactness under threads


@pytest.mark.parametrize("algorithm", EXACT)
def test_eight_threads_on_one_key_admit_exactly_the_limit(algorithm: str) -> None:
    limiter = Limiter(clock=FakeClock())
    rule = Rule(f"hammer.{algorithm}", "1000/hour", algorithm)
    admitted = hammer(limiter, rule, "hot", lambda i, n: 1, tries=500)
    assert 1000 == sum(admitted)
    assert 0 == limiter.peek(rule, "hot", 0).remaining


@pytest.mark.parametrize("algorithm", EXACT)
def test_eight_threads_with_mixed_costs_admit_exactly_the_limit(algorithm: str) -> None:
    """Costs 1, 2 and 3 in turn (each thread ends on cost 1): the admitted costs add up to the limit."""
    limiter = Limiter(clock=FakeClock())
    rule = Rule(f"hammer.{algorithm}", "1000/hour", algorithm)

    def cost(index: int, attempt: int) -> int:
        return 1 if attempt >= 480 else 1 + (index + attempt) % 3

    admitted = hammer(limiter, rule, "hot", cost, tries=500)
    assert 1000 == sum(admitted)
    assert 0 == limiter.peek(rule, "hot", 0).remaining


@pytest.mark.parametrize("algorithm", EXACT)
def test_threads_on_different_keys_do_not_share_limits(algorithm: str) -> None:
    limiter = Limiter(clock=FakeClock(), stripes=4)
    rule = Rule(f"spread.{algorithm}", "30/hour", algorithm)
    admitted = [0] * THREADS
    start = threading.Barrier(THREADS)

    def worker(index: int) -> None:
        start.wait()
        admitted[index] = sum(limiter.try_acquire(rule, f"user-{index}").allowed for _ in range(100))

    run_together(worker)
    assert [30] * THREADS == admitted


# --------------------------------------------------------------------------- bounded size, LRU eviction


def test_a_flood_of_a_million_unique_keys_stays_within_max_keys_and_evicts_the_least_recently_used() -> None:
    clock = FakeClock()
    limiter = Limiter(clock=clock, max_keys=10_000)
    store = limiter.store
    assert isinstance(store, MemoryStore)
    rule = Rule("flood", "50/hour", "fixed_window")
    try_acquire = limiter.try_acquire
    hot_admitted = 0
    most_keys = 0
    for i in range(1_000_000):
        try_acquire(rule, str(i))
        if i % 100 == 0:
            hot_admitted += try_acquire(rule, "hot").allowed  # touched throughout the flood
        if i % 10_000 == 0:
            most_keys = max(most_keys, store.key_count())

    assert most_keys <= 10_000
    assert store.key_count() <= 10_000
    assert store.evicted >= 1_000_000 - 10_000
    assert 50 == hot_admitted  # the hot key's state was never evicted: its limit stayed exact
    assert 0 == limiter.peek(rule, "hot", 0).remaining
    recent = [limiter.peek(rule, str(i), 0).remaining for i in range(999_900, 1_000_000)]
    oldest = [limiter.peek(rule, str(i), 0).remaining for i in range(100)]
    assert [49] * 100 == recent  # the most recently used keys keep their state
    assert [50] * 100 == oldest  # the least recently used were evicted (forgotten: whole again)


def test_max_keys_holds_under_threads_flooding_unique_keys() -> None:
    """Eight threads flooding unique keys: never more than ``max_keys`` held, and a hot key stays exact."""
    limiter = Limiter(clock=FakeClock(), max_keys=1_000)
    store = limiter.store
    assert isinstance(store, MemoryStore)
    rule = Rule("flood", "20/hour", "gcra")
    start = threading.Barrier(THREADS)
    hot = [0] * THREADS
    seen: list[int] = []

    def worker(index: int) -> None:
        start.wait()
        for i in range(10_000):
            limiter.try_acquire(rule, f"{index}-{i}")
            if i % 50 == 0:
                hot[index] += limiter.try_acquire(rule, "hot").allowed
            if i % 1_000 == 0:
                seen.append(store.key_count())

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(seen) <= 1_000
    assert store.key_count() <= 1_000
    assert 20 == sum(hot)


@pytest.mark.parametrize("max_keys", [0, 1, -5, 2.5, "10"])
def test_max_keys_below_two_or_not_an_integer_is_refused(max_keys: object) -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        MemoryStore(max_keys=max_keys)  # type: ignore[arg-type]
    assert "max_keys must be an integer of at least 2" in str(excinfo.value)


# --------------------------------------------------------------------------- expiry of idle keys


def test_idle_keys_are_gone_once_the_store_is_touched_after_they_are_whole() -> None:
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    store = limiter.store
    assert isinstance(store, MemoryStore)
    rule = Rule("idle", "5/s", "gcra")
    for i in range(1_000):
        limiter.try_acquire(rule, f"k{i}")
    assert 1_000 == store.key_count()
    clock.advance(2)  # every key is whole after 0.2 s
    limiter.peek(rule, "k0")  # the store is touched again
    assert 0 == store.key_count()


def test_storage_follows_the_active_keys_while_traffic_goes_on() -> None:
    """A thousand new keys a second for a minute: the keys of earlier seconds expire, memory stays flat."""
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    store = limiter.store
    assert isinstance(store, MemoryStore)
    rule = Rule("idle", "5/s", "gcra")
    held = []
    for second in range(60):
        for i in range(1_000):
            limiter.try_acquire(rule, f"{second}-{i}")
            clock.advance(0.001)
        held.append(store.key_count())
    assert max(held) <= 3_000  # about the last two seconds' worth, never the 60_000 seen


# --------------------------------------------------------------------------- whole keys are not stored


@pytest.mark.parametrize("algorithm", COUNTING)
def test_a_request_of_cost_zero_stores_nothing(algorithm: str) -> None:
    limiter = Limiter(clock=FakeClock())
    assert True is limiter.try_acquire(Rule("r", "5/s", algorithm), "k", 0).allowed
    assert 0 == limiter.store.key_count()  # type: ignore[attr-defined]


@pytest.mark.parametrize("algorithm", [*COUNTING, "concurrency"])
def test_a_refused_request_on_a_fresh_key_stores_nothing(algorithm: str) -> None:
    limiter = Limiter(clock=FakeClock())
    assert False is limiter.try_acquire(Rule("r", "5/s", algorithm), "k", 6).allowed
    assert 0 == limiter.store.key_count()  # type: ignore[attr-defined]


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_log", "token_bucket", "gcra", "leaky_bucket"])
def test_a_key_refunded_back_to_whole_is_dropped(algorithm: str) -> None:
    limiter = Limiter(clock=FakeClock())
    rule = Rule("r", "5/s", algorithm)
    limiter.try_acquire(rule, "k", 3)
    assert 1 == limiter.store.key_count()  # type: ignore[attr-defined]
    limiter.refund(rule, "k", 3)
    assert 0 == limiter.store.key_count()  # type: ignore[attr-defined]


def test_a_key_whose_last_lease_is_released_is_dropped() -> None:
    limiter = Limiter(clock=FakeClock())
    rule = Rule("jobs", "2/30s", "concurrency")
    with limiter.lease(rule, "k"):
        assert 1 == limiter.store.key_count()  # type: ignore[attr-defined]
    assert 0 == limiter.store.key_count()  # type: ignore[attr-defined]


@pytest.mark.parametrize("algorithm", [*COUNTING, "concurrency"])
def test_a_reset_key_is_dropped(algorithm: str) -> None:
    limiter = Limiter(clock=FakeClock())
    rule = Rule("r", "5/s", algorithm)
    limiter.try_acquire(rule, "k", 2)
    limiter.reset(rule, "k")
    assert 0 == limiter.store.key_count()  # type: ignore[attr-defined]


def test_key_count_can_be_asked_per_rule() -> None:
    limiter = Limiter(clock=FakeClock())
    store = limiter.store
    assert isinstance(store, MemoryStore)
    for i in range(3):
        limiter.try_acquire(Rule("a", "5/s"), f"k{i}")
    limiter.try_acquire(Rule("b", "5/s", "fixed_window"), "k")
    assert (3, 1, 4, 0) == (store.key_count("a"), store.key_count("b"), store.key_count(), store.key_count("c"))


# --------------------------------------------------------------------------- asyncio


@pytest.mark.parametrize("algorithm", EXACT)
def test_a_hundred_asyncio_tasks_on_one_key_admit_exactly_the_limit(algorithm: str) -> None:
    limiter = AsyncLimiter(clock=FakeClock())
    rule = Rule(f"tasks.{algorithm}", "250/hour", algorithm)

    async def task() -> int:
        admitted = 0
        for _ in range(10):
            admitted += (await limiter.try_acquire(rule, "hot")).allowed
            await asyncio.sleep(0)
        return admitted

    async def main() -> list[int]:
        async with limiter:
            results = await asyncio.gather(*(task() for _ in range(100)))
            assert 0 == (await limiter.peek(rule, "hot", 0)).remaining
            return results

    assert 250 == sum(asyncio.run(main()))


def test_reservation_survives_sweep_after_key_moves_generation() -> None:
    """A reservation keeps its key through the expiry sweep, even after a refusal moved the key
    to the young generation: five queued acquire() slots reach +6 s, so at +2.2 s (two
    sweeps later) a further 10 is still refused instead of being admitted a full burst."""
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    rule = Rule("r", ["10/s"], algorithm="gcra")  # horizon 1 s
    assert limiter.try_acquire(rule, "k", 10)
    for _ in range(5):  # five acquire() callers each reserve the next slot: the last runs at +5 s
        d = limiter.store.decide(Op.decide(rule.plan, "k", 10, 10_000_000))
        assert d.allowed and d.delay > 0
    clock.advance(1.1)
    limiter.try_acquire(rule, "other")  # runs the sweep: k's generation is set aside
    assert not limiter.try_acquire(rule, "k", 10)  # refused; k moves to the young generation
    clock.advance(1.1)
    limiter.try_acquire(rule, "other")  # runs the sweep again
    # Reservations are booked until +6 s; at +2.2 s a further 10 must still be refused.
    assert not limiter.try_acquire(rule, "k", 10)


def test_reservation_survives_sweep_when_its_store_rotates_the_generation() -> None:
    """A reservation made by a decision that rotates the stripe's generations (the key moves
    young, the young generation fills and becomes the old one) still holds the key: the
    sweep one horizon later keeps it until the reservation has passed."""
    clock = FakeClock()
    store = MemoryStore(max_keys=4, stripes=1, clock=clock)  # 2 keys per generation
    limiter = Limiter(store)
    rule = Rule("r", ["10/s"], algorithm="gcra")  # horizon 1 s
    assert limiter.try_acquire(rule, "b", 10)
    limiter.try_acquire(rule, "a")  # young {b, a} is full: rotates to old
    limiter.try_acquire(rule, "c")  # young {c}
    d = store.decide(Op.decide(rule.plan, "b", 10, 5_000_000))  # b moves to young -> full -> rotates
    assert d.allowed and d.delay_us == 1_000_000  # b's next slot is booked until +2 s
    clock.advance(1.5)
    limiter.try_acquire(rule, "zzz")  # runs the sweep
    assert not limiter.try_acquire(rule, "b", 10), "b's reservation was forgotten by the sweep"


def test_cost_zero_batch_stores_nothing() -> None:
    """A batch of cost 0 on a never-seen key stores nothing (README: "a request of cost 0
    stores nothing"), so probes never count against max_keys nor evict charged keys."""
    limiter = Limiter(clock=FakeClock())
    rule = Rule("r", ["10/s"])
    assert limiter.try_acquire_many([(rule, "probe", 0)])
    assert limiter.store.key_count() == 0


def test_try_acquire_many_alone_lets_idle_keys_expire() -> None:
    """Idle keys expire when the application only calls try_acquire_many: batches run the
    once-a-second sweep as single decisions do, so memory follows the active keys."""
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    rule = Rule("r", ["1000/s"])  # horizon 1 s
    for i in range(100):
        assert limiter.try_acquire_many([(rule, f"user-{i}"), (rule, "*")])
    for _ in range(5):  # every key is whole after 1 s; go well past two horizons
        clock.advance(2)
        limiter.try_acquire_many([(rule, "*")])
    assert limiter.store.key_count() <= 1
