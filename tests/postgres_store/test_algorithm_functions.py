"""The algorithm functions (``rk_<algorithm>``, ``sql/<algorithm>.sql``) decide as the reference.

Called directly, on random states rather than only on those a trace of calls reaches: a
token level far below zero after long reservations or above a smaller burst's full (a
rule whose burst changed), a bucket state written at another scale (a rule whose limits
changed: carried over), a window or a theoretical arrival time ahead
of now (the clock stepped back), leases that expired long ago, costs from 0 to past every
capacity (and 2**62, the largest the store sends), every ``max_wait``, refunds and
releases; one-limit rules (each function's short path) and rules of two or three limits
(its general path). Every reply, new state and lease list must equal the reference's
``decide`` / ``refund``. Seeded, so a failure replays.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.algorithms.base import UNBOUNDED_WAIT, Plan
from ratekeeper.limit import Limit
from ratekeeper.stores.postgres.planner import MAX_COST
from ratekeeper.stores.postgres.schema import migration_sql

from .conftest import PG_URL, drop_schema

pytestmark = pytest.mark.postgres

NAMES = ("fixed_window", "sliding_window_counter", "token_bucket", "gcra", "leaky_bucket", "concurrency")
BUCKETS = ("token_bucket", "gcra", "leaky_bucket")
EPOCH_US = 1_700_000_000_000_000
CASES = 600


@pytest.fixture(scope="module")
def conn() -> Iterator[tuple[psycopg.Connection[Any], str]]:
    schema = f"rk_fn_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(PG_URL, autocommit=True) as c:
            c.execute(migration_sql(schema))
            yield c, schema
    finally:
        drop_schema(schema)


def random_plan(rng: random.Random, name: str) -> Plan:
    limits = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        count = rng.choice((1, 2, 3, 7, 10, 100, 1000, 2**20, rng.randint(1, 50)))
        period = rng.choice((1, 2, 3, 7, 1_000, 1_000_000, 60_000_000, rng.randint(1, 10_000_000)))
        burst = rng.choice((None, None, 1, 4, 9)) if name in BUCKETS else None
        limits.append(Limit.from_us(count, period, burst))
    return ALGORITHMS[name].plan(name, tuple(limits))


def random_state(rng: random.Random, plan: Plan, now: int) -> Any:
    """A state in the reference's form, or None."""
    name = plan.algorithm.name
    if rng.random() < 0.15:
        return None
    if name == "concurrency":
        longest = max(period for _, period in plan.specs)
        times = sorted(now - rng.randint(-3, 2 * longest + 2) for _ in range(rng.choice((1, 2, 5, 12))))
        ids = rng.sample([f"l{i}" for i in range(20)], len(times))
        return tuple(x for i, t in zip(ids, times, strict=True) for x in (i, t, rng.choice((1, 1, 2, 5))))
    state: list[Any] = []
    for own in plan.specs:
        # the scale the state was written at: this plan's, or another's (limits changed since)
        spec = random_plan(rng, name).specs[0] if name in BUCKETS and rng.random() < 0.4 else own
        if name == "token_bucket":
            _, _, _, full = spec
            level = rng.choice((full, 0, rng.randint(-3 * full, full), rng.randint(full, 2 * full), -1000 * full))
            last = now + rng.choice((0, -1, 1, -rng.randint(0, 10**8), rng.randint(0, 10**7)))
            state += (level, last, spec)
        elif name in ("gcra", "leaky_bucket"):
            _, d, _, tau = spec
            state += (now * d + rng.choice((0, -1, 1, rng.randint(-2 * tau, 3 * tau), 1000 * tau)), spec)
        elif name == "fixed_window":
            limit, period = spec
            state += (
                now // period + rng.choice((0, 0, -1, 1, -2)),
                rng.choice((0, 1, limit, limit + 2, rng.randint(0, limit))),
            )
        else:
            limit, period = spec
            state += (
                now // period + rng.choice((0, 0, -1, 1, -2)),
                rng.randint(0, 2 * limit),
                rng.randint(0, limit + 1),
            )
    return tuple(state)


def to_sql(plan: Plan, state: Any) -> tuple[list[int] | None, list[str] | None]:
    """(state, leases) as the functions take and return them."""
    if state is None:
        return None, None
    if plan.algorithm.name == "concurrency":
        return [x for j in range(0, len(state), 3) for x in state[j + 1 : j + 3]], list(state[0::3])
    if plan.algorithm.name in BUCKETS:  # each limit's spec (n, d, capacity, _) as its scale: n, d, capacity
        return [x for v in state for x in (v[:3] if isinstance(v, tuple) else (v,))], None
    return list(state), None


@pytest.mark.parametrize("name", NAMES)
def test_algorithm_function_decides_as_the_reference(conn: tuple[psycopg.Connection[Any], str], name: str) -> None:
    c, schema = conn
    rng = random.Random(f"functions-{name}")
    algorithm = ALGORITHMS[name]
    sql = (
        f"SELECT (r).new_state, (r).new_leases, (r).reply FROM {schema}.rk_{name}("
        "%s::numeric[], %s::text[], %s::bigint, %s::bigint[], %s::bigint, %s::bigint, %s::text, %s::boolean) r"
    )
    for case in range(CASES):
        plan = random_plan(rng, name)
        now = rng.choice((0, 1, rng.randint(0, 10**7), EPOCH_US + rng.randint(0, 10**12), rng.randint(2**52, 2**53)))
        state = random_state(rng, plan, now)
        capacity = max(spec[2] if name in BUCKETS else spec[0] for spec in plan.specs)
        cost = rng.choice((0, 1, 1, rng.randint(0, capacity + 1), capacity, capacity + 1, MAX_COST))
        max_wait = rng.choice((None, None, 0, rng.randint(0, 3 * 10**7), UNBOUNDED_WAIT)) if name in BUCKETS else None
        lease = rng.choice([f"l{i}" for i in range(20)]) if name == "concurrency" else None
        refund = rng.random() < 0.15
        st, ls = to_sql(plan, state)
        spec = [x for limit_spec in plan.specs for x in limit_spec]
        row = c.execute(sql, (st, ls, now, spec, cost, max_wait, lease, refund)).fetchone()
        assert row is not None
        got_state, got_leases, reply = row
        what = f"case {case}: {plan!r} state={state} now={now} cost={cost} max_wait={max_wait} refund={refund}"
        if refund:
            new = algorithm.refund(plan, state, now, cost, lease)
            # a release says whether the lease was held (live); a cost refund says nothing here
            held = plan.leases and lease in algorithm._live(plan, state, now)[0::3]  # type: ignore[attr-defined]
            expected = [1 if held else 0] if plan.leases else None
            assert (to_sql(plan, new), expected) == ((got_state, got_leases), reply), what
            continue
        new, decision = algorithm.decide(plan, state, now, cost, max_wait, lease)
        expected_reply = [
            1 if decision.allowed else 0,
            decision.denied_index,
            decision.retry_us,
            decision.delay_us,
            *decision.remaining_each,
            *decision.reset_us,
        ]
        assert (to_sql(plan, new), expected_reply) == ((got_state, got_leases), reply), what


@pytest.mark.parametrize("name", [name for name in NAMES if name != "concurrency"])
def test_charge_function_charges_as_the_reference(conn: tuple[psycopg.Connection[Any], str], name: str) -> None:
    """``rk_<algorithm>_charge`` (the leaky bucket's is GCRA's) charges without a check as
    ``Algorithm.charge`` does, on the same random states: into debt, down to the deepest
    debt and no further, from states already past it."""
    c, schema = conn
    rng = random.Random(f"charge-functions-{name}")
    algorithm = ALGORITHMS[name]
    function = "rk_gcra_charge" if name == "leaky_bucket" else f"rk_{name}_charge"
    sql = (
        f"SELECT (r).new_state, (r).reply FROM {schema}.{function}("
        "%s::numeric[], %s::bigint, %s::bigint[], %s::bigint) r"
    )
    for case in range(CASES):
        plan = random_plan(rng, name)
        now = rng.choice((0, 1, rng.randint(0, 10**7), EPOCH_US + rng.randint(0, 10**12), rng.randint(2**52, 2**53)))
        state = random_state(rng, plan, now)
        capacity = max(spec[2] if name in BUCKETS else spec[0] for spec in plan.specs)
        cost = rng.choice((0, 1, 1, rng.randint(0, 3 * capacity + 1), capacity, 2 * capacity + 1, MAX_COST))
        st, _ = to_sql(plan, state)
        spec = [x for limit_spec in plan.specs for x in limit_spec]
        row = c.execute(sql, (st, now, spec, cost)).fetchone()
        assert row is not None
        got_state, reply = row
        new, decision = algorithm.charge(plan, state, now, cost)
        expected_reply = [1, -1, 0, 0, *decision.remaining_each, *decision.reset_us]
        what = f"case {case}: {plan!r} state={state} now={now} cost={cost}"
        assert (to_sql(plan, new)[0], expected_reply) == (got_state, reply), what
