"""The PostgreSQL store decides exactly as the reference algorithms on random traces.

Every algorithm, several limits per rule, reservations (``max_wait``), peeks, refunds,
atomic calls and a clock that steps back; several ops per call (as coalesced calls send
them), with explicit ``now``. Seeded, so a failure replays.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from ratekeeper.stores.postgres import PostgresStore
from ratekeeper.stores.postgres_async import AsyncPostgresStore

from .traces import ALGORITHMS, Model, random_trace

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
    async def main() -> None:
        store = AsyncPostgresStore(pg_url)
        try:
            rng = random.Random(f"async-{algorithm}")
            model = Model()
            for i, (now, atomic, ops) in enumerate(random_trace(rng, algorithm, 60)):
                expected = model.run(now, atomic, ops)
                actual = await store.decide_ops(ops, now=now, atomic=atomic)
                assert expected == actual, f"call {i} at now={now} atomic={atomic}: {ops}"
        finally:
            await store.aclose()

    asyncio.run(main())
