"""Random traces of ops and the reference model that decides them (no store, no I/O).

A trace is a list of calls; each call is a list of wire ops sharing one ``now``. The model
applies them as the memory store does: a decide charges what the reference charges, a
peek charges nothing, a refund that leaves a state whole drops it, and an atomic call
whose decides are not all admitted keeps nothing.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable
from typing import Any

from ratekeeper.algorithms.base import Plan
from ratekeeper.decision import Decision
from ratekeeper.limit import Limit
from ratekeeper.rule import Rule
from ratekeeper.stores import wire

ALGORITHMS = (
    "fixed_window",
    "gcra",
    "token_bucket",
    "leaky_bucket",
    "sliding_window_log",
    "sliding_window_counter",
    "concurrency",
)
BURSTY = ("gcra", "token_bucket", "leaky_bucket")

Call = tuple[int, bool, list[wire.Op]]
"""(now, atomic, ops)."""


class Model:
    """The reference decisions for a sequence of calls, state kept per storage key."""

    def __init__(self) -> None:
        self.states: dict[str, Any] = {}

    def run(self, now: int, atomic: bool, ops: list[wire.Op]) -> list[Decision | bool]:
        before = dict(self.states)
        out: list[Decision | bool] = []
        refused = False
        for mode, plan, key, cost, max_wait, lease in ops:
            skey = wire.storage_key("", plan, key)
            state = self.states.get(skey)
            if mode == wire.REFUND:
                # False for a release of a lease this key did not hold, else True
                if state is None:
                    out.append(not plan.leases)
                    continue
                new = plan.algorithm.refund(plan, state, now, cost, lease)
                _, check = plan.decide(new, now, 0, None, None)
                _, held = plan.decide(state, now, 0, None, None)
                out.append(not plan.leases or check.remaining_each != held.remaining_each)
                if max(check[7]) <= 0:
                    self.states.pop(skey, None)
                else:
                    self.states[skey] = new
                continue
            new, decision = plan.decide(state, now, cost, max_wait, lease)
            if mode == wire.DECIDE:
                if new is None:
                    self.states.pop(skey, None)
                else:
                    self.states[skey] = new
                refused = refused or not decision.allowed
            if decision.lease_id is not None and not (mode == wire.DECIDE and cost):
                decision = decision.without_lease()
            out.append(decision)
        if atomic and refused:
            self.states = before
        return out


def random_rule(rng: random.Random, algorithm: str, name: str) -> Rule:
    limits = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        count = rng.choice((1, 2, 3, 5, 7, 10))
        period = rng.choice((1, 7, 1_000, 33_333, 100_000, 1_000_000, 3_000_000))
        burst = rng.choice((None, None, 1, 4, 9)) if algorithm in BURSTY else None
        limits.append(Limit.from_us(count, period, burst))
    return Rule(name, limits, algorithm)


def random_trace(rng: random.Random, algorithm: str, length: int) -> list[Call]:
    """``length`` calls over two rules of ``algorithm`` and three keys."""
    rules = [random_rule(rng, algorithm, f"r{i}") for i in range(2)]
    plans: list[Plan] = [r.plan for r in rules]
    periods = [lim.period_us for r in rules for lim in r.limits]
    now = rng.choice((0, 5_000_000, 1_700_000_000_123_456))
    leases: list[tuple[Plan, str, str]] = []
    calls: list[Call] = []
    serial = 0
    for _ in range(length):
        step = rng.random()
        if step < 0.3:
            now += 0
        elif step < 0.6:
            now += rng.randint(1, 50)
        elif step < 0.9:
            now += rng.randint(1, rng.choice(periods))
        elif step < 0.95:
            now += rng.randint(1, 3 * max(periods))
        else:
            now -= rng.randint(1, 100)  # the clock stepped back
        atomic = rng.random() < 0.15
        ops: list[wire.Op] = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            plan = rng.choice(plans)
            key = rng.choice(("a", "b", "c"))
            kind = rng.random()
            cost = rng.choice((0, 1, 1, 1, 2, 3, 12))
            if atomic or kind < 0.65:
                max_wait = None
                if not atomic and algorithm in BURSTY and rng.random() < 0.3:
                    max_wait = rng.choice((0, 10, 100_000, 2_000_000))
                lease = None
                if plan.leases:
                    serial += 1
                    lease = f"L{serial}"
                    leases.append((plan, key, lease))
                ops.append((wire.DECIDE, plan, key, cost, max_wait, lease))
            elif kind < 0.8:
                ops.append((wire.PEEK, plan, key, cost, None, None))
            elif plan.leases:
                if leases and rng.random() < 0.8:
                    p, k, lease = rng.choice(leases)
                    ops.append((wire.REFUND, p, k, 1, None, lease))
                else:
                    ops.append((wire.REFUND, plan, key, 1, None, "unknown"))
            else:
                ops.append((wire.REFUND, plan, key, rng.choice((1, 2, 5)), None, None))
        calls.append((now, atomic, ops))
    return calls


def check_async_store(pg_url: str, trace: Iterable[Call]) -> None:
    """Run ``trace`` on an ``AsyncPostgresStore`` at ``pg_url``, each call's decisions equal
    to the reference model's (the assertion names the first call that differs)."""
    from ratekeeper.stores.postgres.store_async import AsyncPostgresStore

    async def main() -> None:
        store = AsyncPostgresStore(pg_url)
        try:
            model = Model()
            for i, (now, atomic, ops) in enumerate(trace):
                expected = model.run(now, atomic, ops)
                actual = await store.decide_ops(ops, now=now, atomic=atomic)
                assert expected == actual, f"call {i} at now={now} atomic={atomic}: {ops}"
        finally:
            await store.aclose()

    asyncio.run(main())
