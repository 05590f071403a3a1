"""The PostgreSQL store decides exactly as the reference algorithms on random traces.

Every algorithm, several limits per rule, reservations (``max_wait``), peeks, refunds,
atomic calls and a clock that steps back; several ops per call (as coalesced calls send
them), with explicit ``now``. Seeded, so a failure replays.
"""

from __future__ import annotations

import random

import pytest

from ratekeeper.limit import Limit
from ratekeeper.rule import Rule
from ratekeeper.stores import wire
from ratekeeper.stores.postgres.store import PostgresStore

from .traces import ALGORITHMS, Model, check_async_store, random_trace

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_store_decides_as_the_reference_on_random_traces(store: PostgresStore, algorithm: str, seed: int) -> None:
    rng = random.Random(f"{algorithm}-{seed}")
    model = Model()
    for i, (now, atomic, ops) in enumerate(random_trace(rng, algorithm, 120)):
        expected = model.run(now, atomic, ops)
        actual = store.decide_ops(ops, now=now, atomic=atomic)
        assert expected == actual, f"call {i} at now={now} atomic={atomic}: {ops}"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_async_store_decides_as_the_reference_on_random_traces(pg_url: str, algorithm: str) -> None:
    check_async_store(pg_url, random_trace(random.Random(f"async-{algorithm}"), algorithm, 60))


@pytest.mark.parametrize(
    ("algorithm", "limit"),
    [
        ("gcra", Limit.from_us(999_983, 7_000_001, 3)),  # now * d is far beyond bigint: numeric
        ("token_bucket", Limit.from_us(999_983, 7_000_001, 3)),
        ("leaky_bucket", Limit.from_us(999_983, 7_000_001, 3)),
        ("sliding_window_counter", Limit.from_us(1_000_003, 86_400_000_000)),  # products beyond 2**53
        ("fixed_window", Limit.from_us(1_000_003, 86_400_000_000)),
    ],
)
def test_store_decides_as_the_reference_with_large_numbers(store: PostgresStore, algorithm: str, limit: Limit) -> None:
    rng = random.Random(f"large-{algorithm}")
    plan = Rule(f"large-{algorithm}", [limit], algorithm).plan
    model = Model()
    now = 1_795_000_000_123_456
    for i in range(150):
        now += rng.choice((0, 1, 3, 7, 1000, 7_000_001))
        cost = rng.choice((0, 1, 2, 3, 999_983, 2_000_000))
        ops: list[wire.Op] = [(wire.DECIDE, plan, "k", cost, rng.choice((None, None, 5)), None)]
        assert model.run(now, False, ops) == store.decide_ops(ops, now=now), f"call {i} at now={now}: {ops}"
