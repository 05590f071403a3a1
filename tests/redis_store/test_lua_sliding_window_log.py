"""sliding_window_log.lua decides as algorithms/sliding_window_log.py, field by field: long
logs (hundreds of live entries) that expire a few at a time, several limits over one log,
a clock that steps back (entries stamped with the newest time), refunds that cut into
entries, peeks, at epoch µs near 2^53."""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ratekeeper import Rule
from ratekeeper.op import DECIDE, PEEK, Op
from ratekeeper.stores import wire
from ratekeeper.stores.redis.store import RedisStore

pytestmark = pytest.mark.redis

URL = "redis://127.0.0.1:6379/0"
NEAR_2_53 = 9_007_199_254_000_000


@pytest.fixture
def store(key_prefix: str) -> Iterator[RedisStore]:
    s = RedisStore(URL, prefix=f"{key_prefix}:")
    yield s
    s.close()


@pytest.mark.parametrize("limits", [["200/s"], ["50/100ms", "120/s", "400/5s"]])
def test_long_logs_expire_a_few_entries_at_a_time_like_the_reference(store: RedisStore, limits: list[str]) -> None:
    plan = Rule("swl-long", limits, algorithm="sliding_window_log").plan
    rng = random.Random(len(limits))
    now = NEAR_2_53 - 10**10
    state: Any = None
    longest = 0
    for _ in range(500):
        now += rng.choice([0, 1, 1000, 2500, 5000, 10_000, -3000, 40_000])
        cost = rng.choice([1, 1, 1, 2, 3, 0])
        if rng.random() < 0.05:
            store.refund(Op.refund(plan, "k", cost), now)
            state = plan.algorithm.refund(plan, state, now, cost)
            continue
        commit = rng.random() > 0.1
        new, expected = plan.decide(state, now, cost, None, None)
        if commit:
            state = new
        assert store.decide(Op((DECIDE if commit else PEEK, plan, "k", cost, None, None)), now) == expected
        longest = max(longest, 0 if state is None else state[4] - state[3])
    assert longest >= 100  # the logs were long, as the test says


@pytest.mark.parametrize("limits", [["20/s"], ["5/100ms", "12/s", "40/5s"]])
def test_charges_without_a_check_append_into_debt_like_the_reference(store: RedisStore, limits: list[str]) -> None:
    """Charges past the counts (and past the deepest debt) among decisions, peeks and
    refunds: every decision equals the reference's, remaining below 0 while in debt."""
    plan = Rule("swl-debt", limits, algorithm="sliding_window_log").plan
    rng = random.Random(f"debt-{len(limits)}")
    now = NEAR_2_53 - 10**10
    state: Any = None
    deepest = 0
    for _ in range(300):
        now += rng.choice([0, 1, 1000, 25_000, 100_000, -3000, 400_000])
        cost = rng.choice([1, 1, 2, 0])
        roll = rng.random()
        if roll < 0.05:
            store.refund(Op.refund(plan, "k", cost), now)
            state = plan.algorithm.refund(plan, state, now, cost)
            continue
        if roll < 0.3:
            cost = rng.choice([1, 5, 30, 100])
            state, expected = plan.algorithm.charge(plan, state, now, cost)
            assert store.decide(Op.charge(plan, "k", cost), now) == expected
            deepest = min(deepest, *expected.remaining_each)
            continue
        commit = rng.random() > 0.1
        new, expected = plan.decide(state, now, cost, None, None)
        if commit:
            state = new
        assert store.decide(Op((DECIDE if commit else PEEK, plan, "k", cost, None, None)), now) == expected
    assert deepest < 0  # the key went into debt, as the test says


def read_log(value: bytes) -> dict[str, Any]:
    """The stored log, decoded as sliding_window_log.lua documents its layout."""
    tw, cw = value[-2], value[-1]
    size = 30 + 3 * cw + 2 * tw
    trailer = value[-size:]
    ref, exp = struct.unpack(">dd", trailer[:16])
    start, n, hint = struct.unpack(">III", trailer[16:28])
    fields, at = [], 28
    for width in (cw, tw, cw, tw, cw):
        fields.append(int.from_bytes(trailer[at : at + width], "big"))
        at += width
    records = [
        (
            int.from_bytes(value[k * (tw + cw) : k * (tw + cw) + tw], "big"),
            int.from_bytes(value[k * (tw + cw) + tw : (k + 1) * (tw + cw)], "big"),
        )
        for k in range(n)
    ]
    assert len(value) == n * (tw + cw) + size
    base, ft, fc, lt, lc = fields
    return {
        "tw": tw,
        "cw": cw,
        "ref": ref,
        "exp": exp,
        "start": start,
        "n": n,
        "hint": hint,
        "base": base,
        "front": (ft, fc),
        "newest": (lt, lc),
        "records": records,
    }


def test_stored_log_is_fixed_width_records_and_a_trailer(store: RedisStore, key_prefix: str) -> None:
    """A time offset and a running total per entry, as few bytes as 4x the spans need; an
    expired entry is skipped (start moves past it) and cut away later."""
    plan = Rule("swl-layout", ["10/s"], algorithm="sliding_window_log").plan
    t0 = 1_750_000_000_123_457
    for dt, cost in [(0, 2), (300_000, 1), (900_000, 3), (1_200_000, 1)]:
        assert store.decide(Op.decide(plan, "k", cost), t0 + dt).allowed
    client = redis.Redis.from_url(URL)
    try:
        log = read_log(bytes(client.get(wire.storage_key(f"{key_prefix}:", plan, "k"))))  # type: ignore[arg-type]
    finally:
        client.close()
    assert (log["tw"], log["cw"], log["ref"]) == (3, 1, t0)  # 4 s of µs fit 3 bytes, 40 fits 1
    assert log["records"] == [(0, 2), (300_000, 3), (900_000, 6), (1_200_000, 7)]
    assert (log["start"], log["base"], log["front"], log["newest"]) == (1, 2, (300_000, 3), (1_200_000, 7))


def test_expired_entries_are_cut_away_once_they_are_a_fifth(store: RedisStore, key_prefix: str) -> None:
    """A full log that expires an entry per call keeps at most a fifth (plus a chunk) dead,
    and fewer bytes per entry than the msgpack log it replaces (about 8 here)."""
    plan = Rule("swl-compact", ["600/600ms"], algorithm="sliding_window_log").plan
    now = 1_750_000_000_000_000
    state: Any = None
    client = redis.Redis.from_url(URL)
    try:
        for i in range(3000):
            now += 1000
            state, expected = plan.decide(state, now, 1, None, None)
            assert store.decide(Op.decide(plan, "k", 1), now) == expected
            if i % 97 == 0 and i > 600:
                log = read_log(bytes(client.get(wire.storage_key(f"{key_prefix}:", plan, "k"))))  # type: ignore[arg-type]
                live = log["n"] - log["start"]
                assert live == 600
                assert log["start"] <= max(16, live / 4)
                assert log["tw"] + log["cw"] <= 5
    finally:
        client.close()


def test_refund_cuts_into_the_newest_entries_and_empties_the_log(store: RedisStore) -> None:
    plan = Rule("swl-refund", ["10/s", "12/3s"], algorithm="sliding_window_log").plan
    now = NEAR_2_53 - 5_000_000
    state: Any = None
    steps = [
        (0, 3, "d"),
        (100, 4, "d"),
        (-50, 2, "d"),
        (10, 5, "r"),
        (0, 9, "d"),
        (1_000_100, 2, "r"),
        (0, 6, "d"),
        (0, 40, "r"),
        (0, 1, "d"),
    ]
    for dt, cost, mode in steps:
        now += dt
        if mode == "r":
            store.refund(Op.refund(plan, "k", cost), now)
            state = plan.algorithm.refund(plan, state, now, cost)
            continue
        state, expected = plan.decide(state, now, cost, None, None)
        assert store.decide(Op.decide(plan, "k", cost), now) == expected
    assert state is not None  # the last charge started a new log after the refund emptied it


def test_huge_costs_keep_the_totals_exact(store: RedisStore) -> None:
    """Costs near the 2**50 bound, two live at a time: the running totals of a log that
    never empties pass 2**53 within a few dozen calls unless they are rebased before 2**52,
    and then the decisions would no longer be the reference's."""
    plan = Rule("swl-huge", [f"{2**50}/2ms"], algorithm="sliding_window_log").plan
    now = NEAR_2_53 - 10**9
    state: Any = None
    for i in range(60):
        now += 1000
        cost = 2**49 - 1 - i
        state, expected = plan.decide(state, now, cost, None, None)
        assert store.decide(Op.decide(plan, "k", cost), now) == expected
        assert expected.allowed


def test_a_second_limit_starts_its_search_at_the_hint_and_decides_as_the_reference(
    store: RedisStore, key_prefix: str
) -> None:
    """Two limits over a long log: the shorter window's first entry is kept in the trailer
    (the hint), and a hint that is behind, ahead or out of range still finds the window."""
    plan = Rule("swl-hint", ["300/300ms", "2000/2s"], algorithm="sliding_window_log").plan
    now = 1_750_000_000_000_000
    state: Any = None
    client = redis.Redis.from_url(URL)
    key = wire.storage_key(f"{key_prefix}:", plan, "k")
    try:
        for i in range(1500):
            now += 1000 if i % 7 else 20_000  # jumps move the window past many entries at once
            if i % 211 == 0 and i:
                now -= 50_000  # the clock steps back: the hint is ahead of the window
            state, expected = plan.decide(state, now, 1, None, None)
            assert store.decide(Op.decide(plan, "k", 1), now) == expected
            if i % 101 == 0 and i > 300:
                log = read_log(bytes(client.get(key)))  # type: ignore[arg-type]
                assert log["start"] < log["hint"] < log["n"]
    finally:
        client.close()
