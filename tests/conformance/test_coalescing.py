"""Concurrent calls on one key decide as the same calls made one after another.

A store may coalesce concurrent calls for one key into one round trip (DESIGN §4); the
decisions must be those of serial calls. Twelve callers (threads on a blocking store,
tasks on an async one) each take one unit from ONE key at the same explicit ``now``:
with equal costs the serial decisions depend only on their position, so the store's
decisions, as a multiset, must equal the reference's serial ones, each admitted lease
carrying its caller's id; a peek afterwards sees the same state as the reference.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from conformance.harness import StoreHarness
from conformance.traces import ALGORITHM_NAMES, EPOCH_US
from ratekeeper.decision import Decision
from ratekeeper.op import Op
from ratekeeper.rule import Rule

CALLERS = 12
LIMIT = "5/hour"


def _concurrently(harness: StoreHarness, calls: list[tuple[Any, ...]]) -> list[Decision]:
    """``decide(*args)`` for every call at once: threads released by one barrier, or tasks."""
    if harness.runner is not None:

        async def gather() -> list[Decision]:
            return list(await asyncio.gather(*(harness.store.decide(*args) for args in calls)))

        return harness.runner.run(gather())
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []
    start = threading.Barrier(len(calls))

    def run(i: int) -> None:
        try:
            start.wait(10)
            results[i] = harness.store.decide(*calls[i])
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_concurrent_calls_on_one_key_decide_as_serial_calls(harness: StoreHarness, algorithm: str) -> None:
    tag = harness.tag()
    plan = Rule(f"{tag}.coalesced", [LIMIT], algorithm).plan
    key = f"{tag}.hot"
    now = EPOCH_US
    leases = [f"{tag}.lease{i}" if plan.leases else None for i in range(CALLERS)]

    state = None
    serial = []
    for lease in leases:
        state, decision = plan.algorithm.decide(plan, state, now, 1, None, lease)
        serial.append(decision)
    got = _concurrently(harness, [(Op.decide(plan, key, 1, None, lease), now) for lease in leases])

    def without_lease(d: Decision) -> Decision:
        return d.without_lease()

    assert sorted(map(without_lease, got), key=repr) == sorted(map(without_lease, serial), key=repr)
    for decision, lease in zip(got, leases, strict=True):
        assert decision.lease_id == (lease if decision.allowed else None)
    _, expected_peek = plan.algorithm.decide(plan, state, now, 1, None, None)
    assert harness.call("decide", Op.peek(plan, key, 1), now) == expected_peek
