"""The memory store's sweep: a bounded slice of tables per call, never a walk of every
table; a table whose keys all expired is dropped, ``forget`` drops a rule's table at once,
and a call that raced with a drop decides on a fresh table instead of a dropped one.

The clock is a ``FakeClock``: time moves only when a test says so, so which sweep runs
when is decided by the test, not by the machine's speed."""

from __future__ import annotations

import threading
from typing import Any

from ratekeeper import Limiter, MemoryStore, Rule
from ratekeeper.stores.memory import SWEEP_EVERY_US, SWEEP_GAP_US, SWEEP_TABLES
from ratekeeper.testing import FakeClock

TABLES = 1_000


def rotated(store: MemoryStore) -> int:
    """Tables whose young generation a sweep has set aside (the visible trace of a visit:
    a key written once sits in the young generation until its table is swept)."""
    return sum(1 for t in store._tables.values() if any(s.old and not s.young for s in t.made()))


def many_rules(limiter: Limiter, count: int = TABLES) -> list[Rule]:
    rules = [Rule(f"sweep.r{n}", ["5/minute"], algorithm="fixed_window") for n in range(count)]
    for rule in rules:
        assert limiter.try_acquire(rule, "k")
    return rules


def test_one_sweep_visits_a_bounded_slice_of_the_tables() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    limiter = Limiter(store)
    many_rules(limiter)
    assert store.table_count() == TABLES
    assert rotated(store) == 0
    clock.advance(us=SWEEP_EVERY_US)
    hot = Rule("sweep.hot", ["1000/s"])
    limiter.try_acquire(hot, "k")  # due: this call sweeps once
    assert store.swept_tables <= SWEEP_TABLES
    assert rotated(store) <= SWEEP_TABLES
    limiter.try_acquire(hot, "k")  # the next slice waits at least SWEEP_GAP_US
    assert store.swept_tables <= SWEEP_TABLES


def test_slices_come_in_turn_until_every_table_was_swept() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    limiter = Limiter(store)
    many_rules(limiter)
    hot = Rule("sweep.hot", ["1000/s"])
    clock.advance(us=SWEEP_EVERY_US)
    calls = 0
    while rotated(store) < TABLES:
        limiter.try_acquire(hot, "k")
        clock.advance(us=SWEEP_GAP_US)
        calls += 1
        assert calls <= 2 * TABLES // SWEEP_TABLES, "a table was never swept"
    # each table once: the swept ones went to the back of the line
    assert store.swept_tables <= TABLES + 2 * SWEEP_TABLES


def test_tables_whose_keys_expired_are_dropped() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    limiter = Limiter(store)
    many_rules(limiter)
    hot = Rule("sweep.hot", ["1000/s"])
    clock.advance(120)  # every key of every "5/minute" rule is whole again
    for _ in range(4 * TABLES // SWEEP_TABLES):  # two rounds: one sets the keys aside, one drops them
        limiter.try_acquire(hot, "k")
        clock.advance(us=SWEEP_GAP_US)
    assert store.key_count() <= 1  # the hot rule's key, at most
    assert store.table_count() <= 1
    assert store.dropped_tables >= TABLES


def test_a_dropped_table_comes_back_empty_when_its_rule_is_used_again() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    limiter = Limiter(store)
    rule = Rule("sweep.back", ["2/minute"], algorithm="fixed_window")
    assert limiter.try_acquire(rule, "k")
    for _ in range(4):
        clock.advance(61)
        limiter.try_acquire(Rule("sweep.other", ["1000/s"]), "k")
    assert "sweep.back" not in {t.name for t in store._tables.values()}
    assert [True, True, False] == [limiter.try_acquire(rule, "k").allowed for _ in range(3)]


def test_forget_drops_a_rules_table_and_its_state_at_once() -> None:
    store = MemoryStore(clock=FakeClock())
    limiter = Limiter(store)
    rule = Rule("sweep.forgotten", ["1/hour"], algorithm="fixed_window")
    kept = Rule("sweep.kept", ["1/hour"], algorithm="fixed_window")
    assert limiter.try_acquire(rule, "k") and limiter.try_acquire(kept, "k")
    assert store.forget(rule.plan)
    assert not store.forget(rule.plan)  # nothing left to forget
    assert store.key_count("sweep.forgotten") == 0
    assert store.key_count("sweep.kept") == 1
    assert limiter.try_acquire(rule, "k")  # a fresh state
    assert not limiter.try_acquire(kept, "k")  # untouched


def test_a_rule_with_few_keys_makes_only_their_stripes() -> None:
    store = MemoryStore(clock=FakeClock(), stripes=64)
    limiter = Limiter(store)
    rule = Rule("sweep.small", ["5/minute"])
    assert limiter.try_acquire(rule, "only")
    (table,) = store._tables.values()
    assert len(table.made()) == 1
    for n in range(1_000):
        limiter.try_acquire(rule, f"k{n}")
    assert len(table.made()) == 64


def test_a_stripe_made_in_a_dropped_table_is_dead_and_the_call_goes_to_a_fresh_table() -> None:
    store = MemoryStore(clock=FakeClock(), stripes=64)
    limiter = Limiter(store)
    rule = Rule("sweep.late", ["1/hour"], algorithm="fixed_window")
    assert limiter.try_acquire(rule, "first")
    (old,) = store._tables.values()
    assert store.forget(rule.plan)
    missing = next(i for i, s in enumerate(old.stripes) if s is None)
    assert old.stripe(missing).dead  # a caller that found the old table before the drop
    assert limiter.try_acquire(rule, "first")  # forgotten: a fresh state...
    assert store.table_count() == 1 and store._tables[rule.plan.table] is not old  # ...in a fresh table


class _SignallingLock:
    """A stripe's lock that says when a caller starts waiting for it."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.waiting = threading.Event()

    def acquire(self, blocking: bool = True) -> bool:
        if blocking:
            self.waiting.set()
        return bool(self.lock.acquire(blocking))

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_call_waiting_on_a_table_dropped_meanwhile_decides_on_a_fresh_one() -> None:
    store = MemoryStore(clock=FakeClock(), stripes=1)
    limiter = Limiter(store)
    rule = Rule("sweep.race", ["1/hour"], algorithm="fixed_window")
    table = store._table(rule.plan)  # the empty table a call is about to use
    stripe = table.stripe(0)
    signalling = _SignallingLock(stripe.lock)
    stripe.lock = signalling  # type: ignore[assignment]
    results: list[bool] = []
    signalling.lock.acquire()  # the sweep holds the stripe while it drops the empty table
    caller = threading.Thread(target=lambda: results.append(limiter.try_acquire(rule, "k").allowed), daemon=True)
    try:
        caller.start()
        assert signalling.waiting.wait(10)  # the caller found the table and waits for its stripe
        assert not table.drop_if_empty(store._unlink)  # the lock is held here: the sweep would leave it...
        stripe.dead = True  # ...so do what it does once it holds every lock: mark dead, unlink
        store._unlink(table)
    finally:
        signalling.lock.release()
    caller.join(10)
    assert results == [True]
    # the charge is in the table the store holds now, not in the dropped one
    assert store.key_count("sweep.race") == 1
    assert not limiter.try_acquire(rule, "k")
