"""One caller's bad op fails that caller alone, on every store, sync and asyncio.

Two lines of defence, each tested here against the real stores:

1. Every op is checked at the store's entry against the bounds every store decides
   exactly (``stores.bounds``): a hostile op (a cost or max_wait of 2**63, a release
   without its lease id, a negative cost, a key or lease id no store can encode) gets
   ``InvalidRequest`` before it can join a batch, while many legitimate callers decide
   concurrently on the same keys and get exactly the reference's serial decisions.
2. What only the store can find wrong (an op that slipped past the entry; a key holding
   a value that is not its rule's state) fails a coalesced call without applying any of
   it; the call is decided again in halves, so the guilty op alone gets the error and
   every other op its decision, decided once (the counts show no op charged twice).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from conformance.harness import REDIS_URL, STORES, StoreHarness, harness_of
from conformance.traces import EPOCH_US
from ratekeeper.decision import Decision
from ratekeeper.errors import InvalidRequest, StoreError
from ratekeeper.op import PEEK, Op
from ratekeeper.rule import Rule
from ratekeeper.stores import wire
from stores.test_coalescing_stores import BOUND, Gate, in_thread, joined, observe, open_store, place  # noqa: F401

SERVER_STORES = [p for p in STORES if not str(p.values[0]).startswith("service")]
LIMIT = 1000
CALLERS = 12


@pytest.fixture(scope="module", params=SERVER_STORES)
def harness(request: pytest.FixtureRequest) -> Iterator[StoreHarness]:
    yield from harness_of(request)


def _hostile(tag: str) -> dict[str, Op]:
    """The ops a client of ``/v1/store`` could send that no store decides exactly."""
    plan = Rule(f"{tag}.hostile", ["5/hour"], "token_bucket").plan
    leases = Rule(f"{tag}.hostile-leases", ["5/hour"], "concurrency").plan
    key = f"{tag}.hot"
    return {
        "cost 2**63": Op.decide(plan, key, 2**63),
        "cost 2**50 + 1": Op.decide(plan, key, 2**50 + 1),
        "negative cost": Op.decide(plan, key, -1),
        "max_wait 2**63": Op.decide(plan, key, 1, 2**63),
        "negative max_wait": Op.decide(plan, key, 1, -5),
        "release without lease id": Op.refund(leases, key, 0, None),
        "refund cost 2**63": Op.refund(plan, key, 2**63),
        "lone surrogate key": Op.decide(plan, f"{tag}.\ud800", 1),
        "NUL in lease id": Op.decide(leases, key, 1, None, "a\x00b"),
        "unknown mode": Op(("z", plan, key, 1, None, None)),
    }


HOSTILE = list(_hostile("x"))


def _concurrently(harness: StoreHarness, calls: list[tuple[str, Op, int]]) -> list[Any]:
    """``method(op, now)`` for every call at once (threads behind a barrier, or tasks): each
    result or the exception it raised."""
    if harness.runner is not None:

        async def gather() -> list[Any]:
            return list(
                await asyncio.gather(
                    *(getattr(harness.store, m)(op, now) for m, op, now in calls), return_exceptions=True
                )
            )

        return harness.runner.run(gather())
    results: list[Any] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i: int) -> None:
        method, op, now = calls[i]
        start.wait(BOUND)
        try:
            results[i] = getattr(harness.store, method)(op, now)
        except Exception as exc:  # noqa: BLE001 - compared below
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND * 4)
    return results


@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("algorithm", ["token_bucket", "concurrency"])
def test_a_hostile_op_is_refused_alone_among_concurrent_legitimate_ops(
    harness: StoreHarness, algorithm: str, hostile: str
) -> None:
    tag = harness.tag()
    plan = Rule(f"{tag}.legit", [f"{CALLERS // 2}/hour"], algorithm).plan
    keys = [f"{tag}.hot", f"{tag}.warm"]
    now = EPOCH_US
    bad = _hostile(tag)[hostile]
    calls: list[tuple[str, Op, int]] = []
    leases: list[str | None] = []
    for i in range(CALLERS):
        lease = f"{tag}.lease{i}" if plan.leases else None
        leases.append(lease)
        calls.append(("decide", Op.decide(plan, keys[i % 2], 1, None, lease), now))
    calls.insert(CALLERS // 2, ("refund" if bad.mode == "r" else "decide", bad, now))
    results = _concurrently(harness, calls)

    got_bad = results.pop(CALLERS // 2)
    assert isinstance(got_bad, InvalidRequest), got_bad
    for key_index, key in enumerate(keys):
        state = None
        serial = []
        for i in range(key_index, CALLERS, 2):
            state, decision = plan.algorithm.decide(plan, state, now, 1, None, leases[i])
            serial.append(decision.without_lease())
        mine = results[key_index::2]
        assert all(isinstance(r, Decision) for r in mine), mine
        assert sorted((d.without_lease() for d in mine), key=repr) == sorted(serial, key=repr)
        _, expected_peek = plan.algorithm.decide(plan, state, now, 1, None, None)
        assert harness.call("decide", Op((PEEK, plan, key, 1, None, None)), now) == expected_peek


def test_the_limiters_refuse_a_cost_no_limit_could_admit() -> None:
    from ratekeeper import Limiter

    rule = Rule("too-costly", ["5/hour"])
    with Limiter() as limiter, pytest.raises(InvalidRequest, match=r"at most 2\*\*50"):
        limiter.try_acquire(rule, "k", 2**63)
    with Limiter() as limiter:
        assert not limiter.try_acquire(rule, "k", 2**50).allowed  # the largest cost: refused for good


# -- the second line: what only the store finds wrong ----------------------------------------

PLAN = Rule("isolation", [f"{LIMIT}/hour"], algorithm="fixed_window").plan
LEASES = Rule("isolation-leases", ["5/hour"], algorithm="concurrency").plan
NOW = 1_763_870_000_000_000


def _slipped_past(kind: str) -> Op:
    """An op the store's entry refuses, sent past it (as if it slipped by): each store
    fails the whole coalesced call on it, with an error that applied nothing."""
    if kind.startswith("redis"):
        return Op.refund(LEASES, "guilty", 0, None)  # the Lua raises: no lease id to release (held: see _held)
    return Op.decide(PLAN, "guilty", 1, 2**63)  # past PostgreSQL's bigint: the statement fails


KEYS = ["a", "b", "a", "c", "a", "b", "a", "c"]


def _per_key(results: list[Any]) -> dict[str, list[Any]]:
    """What the ops of ``KEYS`` left (``remaining``), per key, in order; concurrent tasks
    have no order among themselves, so only the set per key is compared where a Redis
    store has two calls in flight."""
    out: dict[str, list[Any]] = {}
    for key, r in zip(KEYS, results, strict=True):
        out.setdefault(key, []).append(r.remaining if isinstance(r, Decision) else r)
    return {key: sorted(values, key=repr, reverse=True) for key, values in out.items()}


SERIAL = {key: [LIMIT - n for n in range(1, KEYS.count(key) + 1)] for key in dict.fromkeys(KEYS)}
"""Each op decided once: the n-th op on a key leaves LIMIT - n."""


def _held() -> Op:
    """A lease on the guilty key, so that its release without an id reaches the Lua's refund."""
    return Op.decide(LEASES, "guilty", 1, None, "held")


@pytest.mark.parametrize(
    "kind", [pytest.param("redis", marks=pytest.mark.redis), pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_store_error_of_one_op_fails_its_thread_alone_in_a_shared_call(kind: str, place: str) -> None:  # noqa: F811
    store = open_store(kind, place, max_in_flight=1, timeout=BOUND)
    try:
        assert store.decide(Op.decide(PLAN, "warm", 1), NOW).allowed
        assert store.decide(_held(), NOW).allowed
        queue = observe(store)
        gate = Gate(store)
        first, first_out = in_thread(lambda: store.decide(Op.decide(PLAN, "k", 1), NOW))
        assert gate.entered.wait(BOUND)
        ops = [Op.decide(PLAN, key, 1) for key in KEYS]
        bad_at = 3
        ops.insert(bad_at, _slipped_past(kind))
        callers = []
        for i, op in enumerate(ops, 1):  # queued behind the gate: they go in one call
            enter: Callable[..., Any] = store._submit if i - 1 == bad_at else store.decide
            callers.append(in_thread(lambda op=op, enter=enter: enter(op, NOW)))  # type: ignore[misc]
            queue.wait_queued(i)
        gate.opened.set()
        joined(first, *(t for t, _ in callers))
        assert first_out["result"].remaining == LIMIT - 1
        outs = [out.get("result", out.get("error")) for _, out in callers]
        assert isinstance(outs[bad_at], StoreError), outs[bad_at]
        good = outs[:bad_at] + outs[bad_at + 1 :]
        assert all(isinstance(r, Decision) for r in good), good
        # in arrival order, each op decided once: the n-th op on a key leaves LIMIT - n
        counts: dict[str, int] = {"k": 1}
        expected = []
        for key in KEYS:
            counts[key] = counts.get(key, 0) + 1
            expected.append(LIMIT - counts[key])
        assert [r.remaining for r in good] == expected
        for key in ("a", "b", "c", "k"):
            assert store.decide(Op.peek(PLAN, key, 1), NOW).remaining == LIMIT - counts[key] - 1
        assert gate.calls > 2  # the shared call failed, and was decided again in parts
        assert store._coalescer.core.in_flight == 0
    finally:
        store.close()


@pytest.mark.parametrize(
    "kind",
    [pytest.param("redis-async", marks=pytest.mark.redis), pytest.param("postgres-async", marks=pytest.mark.postgres)],
)
def test_a_store_error_of_one_op_fails_its_task_alone_in_a_shared_call(kind: str, place: str) -> None:  # noqa: F811
    async def main() -> None:
        store = open_store(kind, place, timeout=BOUND)
        try:
            assert (await store.decide(Op.decide(PLAN, "warm", 1), NOW)).allowed
            assert (await store.decide(_held(), NOW)).allowed
            ops = [Op.decide(PLAN, key, 1) for key in KEYS]
            bad_at = 5
            ops.insert(bad_at, _slipped_past(kind))
            # one tick: every op goes in one call (AsyncCoalescer's flush)
            futures = [
                asyncio.ensure_future((store._submit if i == bad_at else store.decide)(op, NOW))
                for i, op in enumerate(ops)
            ]
            results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), BOUND)
            assert isinstance(results[bad_at], StoreError), results[bad_at]
            good = results[:bad_at] + results[bad_at + 1 :]
            assert all(isinstance(r, Decision) for r in good), good
            assert _per_key(good) == SERIAL
            for key in ("a", "b", "c"):
                assert (await store.decide(Op.peek(PLAN, key, 1), NOW)).remaining == LIMIT - len(SERIAL[key]) - 1
        finally:
            await store.aclose()

    asyncio.run(main())


@pytest.mark.redis
@pytest.mark.parametrize("is_async", [False, True], ids=["redis", "redis-async"])
def test_a_key_holding_another_value_fails_alone_in_a_shared_redis_call(is_async: bool, place: str) -> None:  # noqa: F811
    """A genuine store-side error, through the public entry: one key holds a value that is
    not its rule's state (the Lua refuses it before any write); the ops of the other keys
    in the same call are decided, each once."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.set(wire.storage_key(f"{place}:", PLAN, "garbage"), b"not a state")
    finally:
        client.close()
    ops = [Op.decide(PLAN, key, 1) for key in KEYS]
    bad_at = 4
    ops.insert(bad_at, Op.decide(PLAN, "garbage", 1))

    async def run_async() -> list[Any]:
        store = open_store("redis-async", place, timeout=BOUND)
        try:
            futures = [asyncio.ensure_future(store.decide(op, NOW)) for op in ops]
            return list(await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), BOUND))
        finally:
            await store.aclose()

    if is_async:
        results = asyncio.run(run_async())
    else:
        store = open_store("redis", place, max_in_flight=1, timeout=BOUND)
        try:
            queue = observe(store)
            gate = Gate(store)
            first, _ = in_thread(lambda: store.decide(Op.decide(PLAN, "k", 1), NOW))
            assert gate.entered.wait(BOUND)
            callers = []
            for i, op in enumerate(ops, 1):
                callers.append(in_thread(lambda op=op: store.decide(op, NOW)))  # type: ignore[misc]
                queue.wait_queued(i)
            gate.opened.set()
            joined(first, *(t for t, _ in callers))
            results = [out.get("result", out.get("error")) for _, out in callers]
        finally:
            store.close()
    assert isinstance(results[bad_at], StoreError) and "not a state of this rule" in str(results[bad_at])
    assert _per_key(results[:bad_at] + results[bad_at + 1 :]) == SERIAL
