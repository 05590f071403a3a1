"""The Redis store's clients and connections: Cluster batches across slots, script reloads
per node, pool exhaustion, Sentinel replies after a timeout, hiredis packing, lanes, forks,
and random batches decided as the reference applies them in order.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ratekeeper import Rule
from ratekeeper.errors import StoreError, StoreTimeout
from ratekeeper.op import Op
from ratekeeper.stores.redis.store import RedisStore
from ratekeeper.stores.redis.store_async import AsyncRedisStore
from servers import RedisServer

pytestmark = pytest.mark.redis

URL = "redis://127.0.0.1:6379/0"
EPOCH_US = 1_763_870_000_000_000
BOUND = 5.0
"""The longest any wait in these tests may take: a store that wedges fails the test."""

RULE = Rule("review", ["1000/minute"], algorithm="gcra")
PLAN = RULE.plan


@pytest.fixture
def store(key_prefix: str) -> Iterator[RedisStore]:
    s = RedisStore(URL, prefix=f"{key_prefix}:", max_in_flight=1, timeout=2.0)
    yield s
    s.close()


# -- Cluster ----------------------------------------------------------------------------------


def _keys_on_distinct_slots(store: Any, plan: Any, count: int) -> list[str]:
    """``count`` keys whose storage keys live on distinct Cluster nodes' slots."""
    from redis.crc import key_slot

    keys: list[str] = []
    ranges: set[int] = set()
    i = 0
    while len(keys) < count:
        key = f"user-{i}"
        third = key_slot(store.planner.storage_key(plan, key).encode()) * 3 // 16384  # 3 masters, even split
        if third not in ranges:
            ranges.add(third)
            keys.append(key)
        i += 1
    return keys


@pytest.fixture
def cluster_store(redis_cluster_url: str, key_prefix: str) -> Iterator[RedisStore]:
    s = RedisStore(redis_cluster_url, prefix=f"{key_prefix}:")
    yield s
    s.close()


def _poison(store: Any, plan: Any, key: str) -> None:
    """A value the script cannot read under ``key``'s storage key: that slot's call fails."""
    store.shell.client.set(store.planner.storage_key(plan, key), b"\xc1 not msgpack")


def test_cluster_batch_refused_on_one_slot_charges_no_other_slot(cluster_store: RedisStore) -> None:
    plan = Rule("many", ["3/hour"], algorithm="fixed_window").plan
    a, b, c = _keys_on_distinct_slots(cluster_store, plan, 3)
    assert cluster_store.decide(Op.decide(plan, c, 3), EPOCH_US).allowed  # c is spent
    refused = cluster_store.decide_many([Op.decide(plan, a, 1), Op.decide(plan, b, 2), Op.decide(plan, c, 1)], EPOCH_US)
    assert [d.allowed for d in refused] == [True, True, False]
    peeks = [cluster_store.decide(Op.peek(plan, k, 0), EPOCH_US).remaining for k in (a, b, c)]
    assert peeks == [3, 3, 0]


def test_cluster_batch_with_a_failing_slot_refunds_the_others_and_raises(cluster_store: RedisStore) -> None:
    """One slot's call fails (its key holds what the script cannot read): the slots that
    charged are refunded and the caller gets that slot's StoreError (the other slots
    do not stay charged)."""
    plan = Rule("many-fail", ["3/hour"], algorithm="fixed_window").plan
    a, b, c = _keys_on_distinct_slots(cluster_store, plan, 3)
    _poison(cluster_store, plan, c)
    with pytest.raises(StoreError, match="Redis failed"):
        cluster_store.decide_many([Op.decide(plan, a, 1), Op.decide(plan, b, 2), Op.decide(plan, c, 1)], EPOCH_US)
    peeks = [cluster_store.decide(Op.peek(plan, k, 0), EPOCH_US).remaining for k in (a, b)]
    assert peeks == [3, 3]


def test_cluster_coalesced_calls_fail_only_for_the_slot_that_failed(redis_cluster_url: str, key_prefix: str) -> None:
    """Ops of several slots share one pipeline; one slot's call fails: only its callers get
    the error, the others their decisions (their ops were charged: an error would hide
    that)."""

    async def run() -> None:
        store = AsyncRedisStore(redis_cluster_url, prefix=f"{key_prefix}:", max_in_flight=1)
        a, b, c = _keys_on_distinct_slots(store, PLAN, 3)
        bad = redis.RedisCluster.from_url(redis_cluster_url.replace("redis+cluster://", "redis://").split(",")[0])
        bad.set(store.planner.storage_key(PLAN, c), b"\xc1 not msgpack")
        bad.close()
        results = await asyncio.wait_for(
            asyncio.gather(
                *(store.decide(Op.decide(PLAN, k, 1), EPOCH_US) for k in (a, b, c, a)), return_exceptions=True
            ),
            BOUND,
        )
        assert [getattr(r, "remaining", r) for r in results][:2] == [999, 999], results
        assert [getattr(r, "remaining", None) for r in results] == [999, 999, None, 998]
        assert isinstance(results[2], StoreError)
        await store.aclose()

    asyncio.run(run())


def test_cluster_pipeline_reloads_the_library_on_the_one_node_that_lost_it(
    redis_cluster: Any, cluster_store: RedisStore
) -> None:
    """FUNCTION FLUSH on one master (as a restart or a new node would leave it): the
    pipeline's call to it meets "Function not found", loads the library there and
    decides; the callers never see it."""
    plan = Rule("noscript-cluster", ["5/hour"], algorithm="gcra").plan
    keys = _keys_on_distinct_slots(cluster_store, plan, 3)
    assert all(d.allowed for d in cluster_store.decide_many([Op.decide(plan, k, 1) for k in keys], EPOCH_US))
    flushed = redis.Redis(port=redis_cluster.nodes[1].port)
    flushed.function_flush()
    flushed.close()
    again = cluster_store.decide_many([Op.decide(plan, k, 1) for k in keys], EPOCH_US)
    assert [d.remaining for d in again] == [3, 3, 3]


# -- error translation -------------------------------------------------------------------


def test_no_free_connection_is_a_store_timeout_that_names_max_connections(key_prefix: str) -> None:
    """Every connection of the pool is busy: a caller waits the timeout for one, then gets
    StoreTimeout saying so, not "Redis is unreachable" (this process's load is no outage)."""
    store = RedisStore(URL, prefix=f"{key_prefix}:", max_connections=1, batching=False, timeout=0.3)
    taken = store.shell.client.connection_pool.get_connection()  # the only connection, held here
    try:
        started = time.monotonic()
        with pytest.raises(StoreTimeout, match="max_connections") as caught:
            store.decide(Op.decide(PLAN, "k", 1))
        assert time.monotonic() - started < 0.3 + 0.4
        assert isinstance(caught.value.__cause__, redis.ConnectionError)
    finally:
        store.shell.client.connection_pool.release(taken)
    assert store.decide(Op.decide(PLAN, "k", 1)).allowed
    store.close()


def test_cluster_client_errors_are_store_errors(key_prefix: str) -> None:
    """redis-py's Cluster exceptions are not RedisError: they are translated too (else a
    RedisClusterException would reach the caller, past the failure policy)."""
    import redis.exceptions as rexc

    from ratekeeper.stores.redis.errors import store_errors, translate

    error = rexc.SlotNotCoveredError("slot 42 is not covered")
    assert isinstance(error, store_errors())
    assert isinstance(translate(error, "a decision"), StoreError)


# -- Sentinel ---------------------------------------------------------------------------------


def test_sentinel_call_after_a_timed_out_one_reads_its_own_reply(fresh_sentinel_set: Any, key_prefix: str) -> None:
    """A read that timed out behind Sentinel drops its connection: the next call never reads
    the late reply of the call before it as its own (redis-py's sync Sentinel connection
    keeps the connection: ``SentinelReadDisconnect``; the next call on it would get the
    stale reply, another key's decision)."""
    store = RedisStore(fresh_sentinel_set.sentinel_url(), prefix=f"{key_prefix}:", timeout=0.3, batching=False)
    one = Rule("one-limit", ["7/hour"], algorithm="fixed_window").plan
    two = Rule("two-limits", ["3/hour", "50/day"], algorithm="fixed_window").plan
    assert store.decide(Op.decide(one, "a", 1), EPOCH_US).remaining == 6
    master = fresh_sentinel_set.master()
    master.pause()
    try:
        with pytest.raises(StoreTimeout):
            store.decide(Op.decide(one, "a", 1), EPOCH_US)
        pooled = list(store.shell.client.connection_pool._available_connections)
        # dropped, not kept with a reply to come (the pool's check for unread data only
        # sees a reply that has arrived by the time of the next checkout: a race)
        assert pooled and all(c._sock is None for c in pooled)
    finally:
        master.resume()
    decision = store.decide(Op.decide(two, "b", 1), EPOCH_US)
    assert decision.limits[0].remaining == 2 and decision.limits[1].remaining == 49
    store.close()


def test_async_cluster_store_is_usable_again_once_a_dead_node_is_back(key_prefix: str) -> None:
    """A node dies, calls to it fail, the node comes back: the store decides again.
    Before, redis-py's asyncio Cluster node kept each connection whose connect failed out
    of its free list, and after max_connections failures refused every call for good
    ("Too many connections"), even with the node back."""
    from server_fixtures import start_or_skip
    from servers import RedisCluster

    cluster = start_or_skip(RedisCluster)
    try:

        async def run() -> None:
            store = AsyncRedisStore(cluster.url, prefix=f"{key_prefix}:", max_connections=2, timeout=0.5)
            keys = [f"user-{i}" for i in range(30)]
            assert all(d.allowed for d in await asyncio.gather(*(store.decide(Op.decide(PLAN, k, 1)) for k in keys)))
            cluster.nodes[0].kill()
            for _ in range(6):  # more failed connects than the node has connections
                failed = await asyncio.gather(
                    *(store.decide(Op.decide(PLAN, k, 1)) for k in keys), return_exceptions=True
                )
                assert any(isinstance(r, StoreError) for r in failed)
            cluster.nodes[0].restart()
            deadline = time.monotonic() + 30
            while True:
                results = await asyncio.gather(
                    *(store.decide(Op.decide(PLAN, k, 1)) for k in keys), return_exceptions=True
                )
                errors = [r for r in results if isinstance(r, BaseException)]
                if not errors:
                    break
                assert time.monotonic() < deadline, f"still failing: {errors[0]!r}"
                await asyncio.sleep(0.2)
            await store.aclose()

        asyncio.run(run())
    finally:
        cluster.close()


# -- main.lua: batches --------------------------------------------------------------------


@pytest.mark.parametrize("by", ["FCALL", "EVALSHA"])
@pytest.mark.parametrize("algorithm", ["gcra", "token_bucket", "fixed_window", "sliding_window_log", "concurrency"])
def test_random_batches_decide_as_the_reference_applied_in_order(store: RedisStore, algorithm: str, by: str) -> None:
    """One script call carrying many ops (what coalescing sends): two rules of the same
    algorithm and limit count but other values, two keys, decides, peeks and refunds,
    the clock stepping back. main.lua parses a rule's limits once for consecutive ops of
    the same rule: a rule that differs only in its values must not be taken for it. The
    same by EVALSHA of the composed script (a server without Functions)."""
    import random

    if by == "EVALSHA":
        store.planner.functions = False

    from refund_reference import refund_as_stores, refunded_as_stores

    rng = random.Random(7)
    plans = [
        Rule(f"batch-{algorithm}-a", ["5/3s", "20/minute"], algorithm=algorithm).plan,
        Rule(f"batch-{algorithm}-b", ["11/s", "2/100ms"], algorithm=algorithm).plan,
    ]
    states: dict[tuple[int, str], Any] = {}
    now = 1_750_000_000_123_457
    leases = 0
    for _ in range(40):
        now += rng.choice([0, 17, 100_000, 999_999, -5000])
        ops: list[Any] = []
        expected: list[Any] = []
        for _ in range(rng.choice([2, 5, 12])):
            plan, key = rng.choice(plans), rng.choice("ab")
            slot, cost = (plans.index(plan), key), rng.randint(0, 3)
            leases += 1
            lease = f"l{leases}" if plan.leases else None
            if rng.random() < 0.15:
                if plan.leases:
                    lease = rng.choice([*(states.get(slot) or ())[0::3], "unknown"])
                ops.append(("r", plan, key, cost, None, lease))
                expected.append(refunded_as_stores(plan, states.get(slot), now, cost, lease))
                states[slot] = refund_as_stores(plan, states.get(slot), now, cost, lease)
                continue
            mode = "d" if rng.random() < 0.8 else "p"
            new, decision = plan.decide(states.get(slot), now, cost, None, lease)
            if mode == "d":
                states[slot] = new
            ops.append((mode, plan, key, cost, None, lease))
            expected.append(decision)
        assert store._run(ops, now) == expected


def test_async_connections_pack_with_hiredis_and_keep_redis_py_rules(redis_server: RedisServer) -> None:
    """The asyncio store's connections pack commands with hiredis (redis-py's asyncio
    packer cost 45 % of a coalesced call): a command name with a space ("SCRIPT LOAD", on
    NOSCRIPT where Functions are not to be had) still splits, and an argument it cannot send is redis-py's DataError."""

    async def run() -> None:
        store = AsyncRedisStore(redis_server.url, prefix="rk:")
        connection = store.shell.client.connection_pool.connection_class(host="127.0.0.1", port=redis_server.port)
        packed = b"".join(connection.pack_command("SCRIPT LOAD", "return 1"))
        assert packed == b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n$8\r\nreturn 1\r\n"
        with pytest.raises(redis.DataError):
            connection.pack_command("SET", "k", object())
        await store.shell.client.function_flush()  # a private server: the next call loads the library again
        assert (await store.decide(Op.decide(PLAN, "k", 1), EPOCH_US)).remaining == 999
        await store.aclose()

    asyncio.run(run())


def test_lanes_never_take_the_last_connection_of_the_pool(key_prefix: str) -> None:
    """Threads holding an in-flight slot send on connections of their own (lanes); with
    as few connections as slots there are no lanes, so try_acquire_many and reset still
    find a connection in the pool."""
    store = RedisStore(URL, prefix=f"{key_prefix}:", max_connections=1, max_in_flight=1, timeout=0.3)
    assert store.decide(Op.decide(PLAN, "k", 1), EPOCH_US).allowed
    assert store.decide_many([Op.decide(PLAN, "k", 1)], EPOCH_US)[0].allowed
    store.reset(PLAN, "k")
    store.close()
    laned = RedisStore(URL, prefix=f"{key_prefix}:", max_in_flight=1)
    assert laned.decide(Op.decide(PLAN, "k", 1), EPOCH_US).allowed
    assert len(laned.shell.lanes) == 1  # the lane is idle again, for the next slot holder
    laned.close()


def test_a_forked_child_never_shares_the_parents_connection(key_prefix: str) -> None:
    """A store used before a fork (a preloading web server) decides in the child on
    connections of the child's own: parent and child reading replies from one socket
    would take each other's decisions."""
    import multiprocessing

    store = RedisStore(URL, prefix=f"{key_prefix}:", max_in_flight=1)
    assert store.decide(Op.decide(PLAN, "parent", 1), EPOCH_US).remaining == 999  # the parent's lane exists
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def child() -> None:
        lane = store.shell.lanes[0] if store.shell.lanes else None
        decisions = [store.decide(Op.decide(PLAN, "child", 1), EPOCH_US).remaining for _ in range(50)]
        results.put((decisions, store.shell.lanes[0] is not lane))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads around (pytest's)
        process = context.Process(target=child)
        process.start()
    parent = [store.decide(Op.decide(PLAN, "parent", 1), EPOCH_US).remaining for _ in range(50)]
    decisions, own_lane = results.get(timeout=BOUND)
    process.join(BOUND)
    assert parent == list(range(998, 948, -1))
    assert decisions == list(range(999, 949, -1))
    assert own_lane
    store.close()
