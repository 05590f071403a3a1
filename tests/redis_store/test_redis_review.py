"""Review of the Redis store: the hand-off of coalesced calls (threads and asyncio) never
wedges, errors reach every waiter, cancelled callers charge nothing, and the script
writes only what the reference would keep.

The store talks to the real Redis; where a test must hold a call in flight, it wraps the
store's ``_evalsha`` (one script call) with a gate (the call still goes to Redis once the gate opens). Every
wait here is bounded, so a wedged store fails the test instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import signal
import threading
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


class Interrupt(BaseException):
    """Stands for KeyboardInterrupt (raised by this test's own signal handler)."""


class _Gate:
    """Wraps a sync store's ``_evalsha``: calls block until ``open`` (at most BOUND); counts ops sent."""

    def __init__(self, store: Any, fail_with: BaseException | None = None) -> None:
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.ops: list[int] = []
        self.fail_with = fail_with
        send = store._evalsha

        def gated(script: Any, keys: Any, args: Any, client: Any = None) -> Any:
            self.ops.append(int(args[2]))
            self.entered.set()
            assert self.opened.wait(BOUND), "the gate was never opened"
            if self.fail_with is not None:
                exc, self.fail_with = self.fail_with, None
                raise exc
            return send(script, keys, args, client)

        store._evalsha = gated


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.001)


def _in_thread(target: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = target()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.fixture
def store(key_prefix: str) -> Iterator[RedisStore]:
    s = RedisStore(URL, prefix=f"{key_prefix}:", max_in_flight=1, timeout=2.0)
    yield s
    s.close()


# -- threads --------------------------------------------------------------------------------


def test_a_thread_interrupted_while_queued_hands_its_place_on(store: RedisStore) -> None:
    """A thread interrupted (KeyboardInterrupt) while its op waits in the queue withdraws
    it: the threads queued after it still get their decisions and the store stays usable
    (before: the interrupted thread was later made the lead of a call it never sent, and
    every thread queued with it waited forever)."""
    gate = _Gate(store)
    first, first_out = _in_thread(lambda: store.decide(Op.decide(PLAN, "k", 1), EPOCH_US))
    assert gate.entered.wait(BOUND)
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main

    def on_signal(signum: int, frame: Any) -> None:
        raise Interrupt

    previous = signal.signal(signal.SIGUSR1, on_signal)
    try:

        def interrupt_when_queued() -> None:
            _until(lambda: len(store._coalescer.core.queue) == 1, "the main thread is queued")
            signal.pthread_kill(main, signal.SIGUSR1)

        threading.Thread(target=interrupt_when_queued, daemon=True).start()
        with pytest.raises(Interrupt):
            store.decide(Op.decide(PLAN, "k", 1), EPOCH_US)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    later, later_out = _in_thread(lambda: store.decide(Op.decide(PLAN, "k", 1), EPOCH_US))
    _until(lambda: len(store._coalescer.core.queue) == 1, "the later thread is queued")
    gate.opened.set()
    first.join(BOUND)
    later.join(BOUND)
    assert not first.is_alive() and not later.is_alive(), "a thread waits forever"
    assert first_out["result"].remaining == 999
    assert later_out["result"].remaining == 998  # the interrupted op was never sent
    assert gate.ops == [1, 1]
    assert store._coalescer.core.in_flight == 0
    assert store.decide(Op.decide(PLAN, "k", 1), EPOCH_US).remaining == 997


def test_a_queued_thread_waits_at_most_the_timeout_and_its_op_is_not_sent(key_prefix: str) -> None:
    """Behind a call that does not return, a queued thread gets StoreTimeout after the
    store's timeout (before: it waited as long as the call in flight), and its op is
    withdrawn, so it charges nothing."""
    store = RedisStore(URL, prefix=f"{key_prefix}:", max_in_flight=1, timeout=0.3)
    gate = _Gate(store)
    first, first_out = _in_thread(lambda: store.decide(Op.decide(PLAN, "k", 1), EPOCH_US))
    assert gate.entered.wait(BOUND)
    started = time.monotonic()
    with pytest.raises(StoreTimeout):
        store.decide(Op.decide(PLAN, "k", 1), EPOCH_US)
    assert time.monotonic() - started < 0.3 + 0.5
    gate.opened.set()
    first.join(BOUND)
    assert first_out["result"].remaining == 999
    assert store.decide(Op.decide(PLAN, "k", 1), EPOCH_US).remaining == 998  # the timed-out op charged nothing
    assert gate.ops == [1, 1]
    store.close()


def test_an_interrupt_in_the_thread_sending_a_call_reaches_the_others_as_a_store_error(store: RedisStore) -> None:
    """The lead thread of a coalesced call is interrupted during the call: it raises its
    interrupt, the other threads of the call get a StoreError (not another thread's
    interrupt), and the store keeps working."""
    opened, entered = threading.Event(), threading.Event()
    send = store._evalsha
    calls: list[int] = []

    def scripted(script: Any, keys: Any, args: Any, client: Any = None) -> Any:
        calls.append(int(args[2]))
        if len(calls) == 1:
            entered.set()
            assert opened.wait(BOUND)
        elif len(calls) == 2:
            raise Interrupt
        return send(script, keys, args, client)

    store._evalsha = scripted  # type: ignore[method-assign]
    first, first_out = _in_thread(lambda: store.decide(Op.decide(PLAN, "k", 1), EPOCH_US))
    assert entered.wait(BOUND)
    waiters = [_in_thread(lambda: store.decide(Op.decide(PLAN, "k", 1), EPOCH_US)) for _ in range(3)]
    _until(lambda: len(store._coalescer.core.queue) == 3, "three threads are queued")
    opened.set()
    for thread, _ in [(first, first_out), *waiters]:
        thread.join(BOUND)
        assert not thread.is_alive(), "a thread waits forever"
    assert first_out["result"].allowed
    assert calls == [1, 3]
    errors = sorted(type(out.get("error")).__name__ for _, out in waiters)
    assert errors == ["Interrupt", "StoreError", "StoreError"]
    assert store._coalescer.core.in_flight == 0
    assert store.decide(Op.decide(PLAN, "k", 1), EPOCH_US).allowed


def test_threads_queued_behind_a_timed_out_call_get_its_error_at_once(redis_server: RedisServer) -> None:
    """Redis hangs (SIGSTOP): the call in flight times out, and the threads queued behind it
    get that StoreTimeout then, instead of each sending a call that waits the timeout again."""
    store = RedisStore(redis_server.url, prefix="rk:", max_in_flight=1, timeout=0.3)
    sent: list[int] = []
    send = store._evalsha

    def counted(script: Any, keys: Any, args: Any, client: Any = None) -> Any:
        sent.append(1)
        return send(script, keys, args, client)

    store._evalsha = counted  # type: ignore[method-assign]
    assert store.decide(Op.decide(PLAN, "k", 1)).allowed  # connected
    redis_server.pause()
    try:
        started = time.monotonic()
        threads = [_in_thread(lambda: store.decide(Op.decide(PLAN, "k", 1))) for _ in range(6)]
        for thread, _ in threads:
            thread.join(BOUND)
        elapsed = time.monotonic() - started
    finally:
        redis_server.resume()
    assert all(isinstance(out.get("error"), StoreTimeout) for _, out in threads)
    assert elapsed < 0.3 + 0.4  # one timeout, not one per queued round
    assert len(sent) <= 3  # the first call (and maybe a second) only: the queue got their error
    assert store._coalescer.core.in_flight == 0
    assert store.decide(Op.decide(PLAN, "k", 1)).allowed  # recovered
    store.close()


# -- asyncio --------------------------------------------------------------------------------


class _AsyncGate:
    """Wraps an async store's ``_evalsha``: calls wait until ``opened`` is set; counts ops sent."""

    def __init__(self, store: AsyncRedisStore, fail_with: BaseException | None = None) -> None:
        self.opened = asyncio.Event()
        self.ops: list[int] = []
        self.fail_with = fail_with
        send = store._evalsha

        async def gated(script: Any, keys: Any, args: Any, client: Any = None) -> Any:
            self.ops.append(int(args[2]))
            await asyncio.wait_for(self.opened.wait(), BOUND)
            if self.fail_with is not None:
                exc, self.fail_with = self.fail_with, None
                raise exc
            return await send(script, keys, args, client)

        store._evalsha = gated  # type: ignore[method-assign]


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_caller_cancelled_while_queued_charges_nothing_and_the_others_are_answered(key_prefix: str) -> None:
    async def run() -> None:
        store = AsyncRedisStore(URL, prefix=f"{key_prefix}:", max_in_flight=1)
        gate = _AsyncGate(store)
        first = asyncio.ensure_future(store.decide(Op.decide(PLAN, "k", 1), EPOCH_US))
        await _settle()
        queued = [asyncio.ensure_future(store.decide(Op.decide(PLAN, "k", 1), EPOCH_US)) for _ in range(3)]
        await _settle()
        queued[1].cancel()
        await _settle()
        gate.opened.set()
        done = await asyncio.wait_for(asyncio.gather(first, queued[0], queued[2]), BOUND)
        assert [d.remaining for d in done] == [999, 998, 997]
        assert gate.ops == [1, 2]  # the cancelled op was not sent
        assert store._coalescer.core.in_flight == 0
        await store.aclose()

    asyncio.run(run())


def test_a_caller_cancelled_while_its_call_is_in_flight_leaves_the_call_to_the_others(key_prefix: str) -> None:
    async def run() -> None:
        store = AsyncRedisStore(URL, prefix=f"{key_prefix}:", max_in_flight=1)
        gate = _AsyncGate(store)
        callers = [asyncio.ensure_future(store.decide(Op.decide(PLAN, "k", 1), EPOCH_US)) for _ in range(3)]
        await _settle()
        callers[0].cancel()
        await _settle()
        gate.opened.set()
        done = await asyncio.wait_for(asyncio.gather(*callers[1:]), BOUND)
        assert [d.remaining for d in done] == [998, 997]  # the cancelled caller's op ran: it was sent
        assert store._coalescer.core.in_flight == 0
        assert (await store.decide(Op.decide(PLAN, "k", 1), EPOCH_US)).remaining == 996
        await store.aclose()

    asyncio.run(run())


def test_an_error_reaches_every_caller_of_the_call_and_a_cancelled_call_is_a_store_error(key_prefix: str) -> None:
    """Every caller of a failed call gets the error; a call cancelled under its callers
    (not the callers themselves) reaches them as StoreError, never as CancelledError."""

    async def run() -> None:
        store = AsyncRedisStore(URL, prefix=f"{key_prefix}:", max_in_flight=1)
        gate = _AsyncGate(store, fail_with=StoreError("boom"))
        callers = [asyncio.ensure_future(store.decide(Op.decide(PLAN, f"k{i}", 1), EPOCH_US)) for i in range(4)]
        await _settle()
        gate.opened.set()
        results = await asyncio.wait_for(asyncio.gather(*callers, return_exceptions=True), BOUND)
        assert [str(r) for r in results] == ["boom"] * 4
        gate.opened.clear()
        callers = [asyncio.ensure_future(store.decide(Op.decide(PLAN, f"k{i}", 1), EPOCH_US)) for i in range(2)]
        await _settle()
        (task,) = store._coalescer.tasks
        task.cancel()
        results = await asyncio.wait_for(asyncio.gather(*callers, return_exceptions=True), BOUND)
        assert [type(r) for r in results] == [StoreError, StoreError]
        assert store._coalescer.core.in_flight == 0
        gate.opened.set()
        assert (await store.decide(Op.decide(PLAN, "k0", 1), EPOCH_US)).allowed
        await store.aclose()

    asyncio.run(run())


def test_aclose_answers_every_queued_op_before_closing(key_prefix: str) -> None:
    async def run() -> None:
        store = AsyncRedisStore(URL, prefix=f"{key_prefix}:", max_in_flight=1, max_batch=2)
        callers = [asyncio.ensure_future(store.decide(Op.decide(PLAN, "k", 1), EPOCH_US)) for _ in range(7)]
        await asyncio.sleep(0)
        await asyncio.wait_for(store.aclose(), BOUND)
        done = await asyncio.wait_for(asyncio.gather(*callers), BOUND)
        assert sorted(d.remaining for d in done) == list(range(993, 1000))

    asyncio.run(run())


def test_a_store_used_on_a_second_event_loop_says_so_instead_of_hanging(key_prefix: str) -> None:
    """redis-py's connections belong to one loop: a second loop gets a RuntimeError that
    says what to do (before: "Event loop is closed" from redis-py, or a hang when the
    first loop had left a flush scheduled)."""
    store = AsyncRedisStore(URL, prefix=f"{key_prefix}:")

    async def once() -> bool:
        return (await asyncio.wait_for(store.decide(Op.decide(PLAN, "k", 1), EPOCH_US), BOUND)).allowed

    async def main() -> None:
        assert await once()
        other, out = _in_thread(lambda: asyncio.run(once()))  # a second loop, in another thread
        await asyncio.to_thread(other.join, BOUND)
        assert isinstance(out.get("error"), RuntimeError)
        assert "another event loop" in str(out["error"])
        assert await once()  # the first loop still decides
        await store.aclose()

    asyncio.run(main())


def test_async_callers_queued_behind_a_timed_out_call_get_its_error_at_once(redis_server: RedisServer) -> None:
    async def run() -> None:
        store = AsyncRedisStore(redis_server.url, prefix="rk:", max_in_flight=1, timeout=0.3)
        assert (await store.decide(Op.decide(PLAN, "k", 1))).allowed
        redis_server.pause()
        try:
            started = time.monotonic()
            first = asyncio.ensure_future(store.decide(Op.decide(PLAN, "k", 1)))
            await asyncio.sleep(0.05)  # the first call is in flight; these queue behind it
            rest = [asyncio.ensure_future(store.decide(Op.decide(PLAN, "k", 1))) for _ in range(5)]
            results = await asyncio.wait_for(asyncio.gather(first, *rest, return_exceptions=True), BOUND)
            elapsed = time.monotonic() - started
        finally:
            redis_server.resume()
        assert all(isinstance(r, StoreTimeout) for r in results)
        assert elapsed < 0.3 + 0.4
        assert store._coalescer.core.in_flight == 0
        assert (await store.decide(Op.decide(PLAN, "k", 1))).allowed
        await store.aclose()

    asyncio.run(run())


def test_raw_client_sees_the_same_counter(key_prefix: str) -> None:
    """Sanity for the gates above: the ops they let through really reached Redis."""
    store = RedisStore(URL, prefix=f"{key_prefix}:")
    store.decide(Op.decide(PLAN, "k", 1), EPOCH_US)
    client = redis.Redis.from_url(URL)
    assert client.exists(store.core.storage_key(PLAN, "k")) == 1
    client.close()
    store.close()


# -- Cluster ----------------------------------------------------------------------------------


def _keys_on_distinct_slots(store: Any, plan: Any, count: int) -> list[str]:
    """``count`` keys whose storage keys live on distinct Cluster nodes' slots."""
    from redis.crc import key_slot

    keys: list[str] = []
    ranges: set[int] = set()
    i = 0
    while len(keys) < count:
        key = f"user-{i}"
        third = key_slot(store.core.storage_key(plan, key).encode()) * 3 // 16384  # 3 masters, even split
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
    store.client.set(store.core.storage_key(plan, key), b"\xc1 not msgpack")


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
    charged are refunded and the caller gets that slot's StoreError (before: the error
    was raised and the other slots stayed charged)."""
    plan = Rule("many-fail", ["3/hour"], algorithm="fixed_window").plan
    a, b, c = _keys_on_distinct_slots(cluster_store, plan, 3)
    _poison(cluster_store, plan, c)
    with pytest.raises(StoreError, match="Redis failed"):
        cluster_store.decide_many([Op.decide(plan, a, 1), Op.decide(plan, b, 2), Op.decide(plan, c, 1)], EPOCH_US)
    peeks = [cluster_store.decide(Op.peek(plan, k, 0), EPOCH_US).remaining for k in (a, b)]
    assert peeks == [3, 3]


def test_cluster_coalesced_calls_fail_only_for_the_slot_that_failed(redis_cluster_url: str, key_prefix: str) -> None:
    """Ops of several slots share one pipeline; one slot's call fails: only its callers get
    the error, the others their decisions (before: every caller got the error, though
    their ops had been charged)."""

    async def run() -> None:
        store = AsyncRedisStore(redis_cluster_url, prefix=f"{key_prefix}:", max_in_flight=1)
        a, b, c = _keys_on_distinct_slots(store, PLAN, 3)
        bad = redis.RedisCluster.from_url(redis_cluster_url.replace("redis+cluster://", "redis://").split(",")[0])
        bad.set(store.core.storage_key(PLAN, c), b"\xc1 not msgpack")
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


def test_cluster_pipeline_reloads_the_script_on_the_one_node_that_lost_it(
    redis_cluster: Any, cluster_store: RedisStore
) -> None:
    """SCRIPT FLUSH on one master: the pipeline's call to it meets NOSCRIPT, loads the
    script there and decides; the callers never see it."""
    plan = Rule("noscript-cluster", ["5/hour"], algorithm="gcra").plan
    keys = _keys_on_distinct_slots(cluster_store, plan, 3)
    assert all(d.allowed for d in cluster_store.decide_many([Op.decide(plan, k, 1) for k in keys], EPOCH_US))
    flushed = redis.Redis(port=redis_cluster.nodes[1].port)
    flushed.script_flush()
    flushed.close()
    again = cluster_store.decide_many([Op.decide(plan, k, 1) for k in keys], EPOCH_US)
    assert [d.remaining for d in again] == [3, 3, 3]


# -- error translation -------------------------------------------------------------------


def test_no_free_connection_is_a_store_timeout_that_names_max_connections(key_prefix: str) -> None:
    """Every connection of the pool is busy: a caller waits the timeout for one, then gets
    StoreTimeout saying so (before: "Redis is unreachable", which also counted as an outage)."""
    store = RedisStore(URL, prefix=f"{key_prefix}:", max_connections=1, batching=False, timeout=0.3)
    taken = store.client.connection_pool.get_connection()  # the only connection, held here
    try:
        started = time.monotonic()
        with pytest.raises(StoreTimeout, match="max_connections") as caught:
            store.decide(Op.decide(PLAN, "k", 1))
        assert time.monotonic() - started < 0.3 + 0.4
        assert isinstance(caught.value.__cause__, redis.ConnectionError)
    finally:
        store.client.connection_pool.release(taken)
    assert store.decide(Op.decide(PLAN, "k", 1)).allowed
    store.close()


def test_cluster_client_errors_are_store_errors(key_prefix: str) -> None:
    """redis-py's Cluster exceptions are not RedisError: they are translated too (before:
    a RedisClusterException reached the caller, past the failure policy)."""
    import redis.exceptions as rexc

    from ratekeeper.stores.redis.sansio import store_errors, translate

    error = rexc.SlotNotCoveredError("slot 42 is not covered")
    assert isinstance(error, store_errors())
    assert isinstance(translate(error, "a decision"), StoreError)


# -- Sentinel ---------------------------------------------------------------------------------


def test_sentinel_call_after_a_timed_out_one_reads_its_own_reply(fresh_sentinel_set: Any, key_prefix: str) -> None:
    """A read that timed out behind Sentinel drops its connection: the next call never reads
    the late reply of the call before it as its own (redis-py's sync Sentinel connection
    kept the connection, and with timeouts no longer retried the next call on it got the
    stale reply: another key's decision)."""
    store = RedisStore(fresh_sentinel_set.sentinel_url(), prefix=f"{key_prefix}:", timeout=0.3, batching=False)
    one = Rule("one-limit", ["7/hour"], algorithm="fixed_window").plan
    two = Rule("two-limits", ["3/hour", "50/day"], algorithm="fixed_window").plan
    assert store.decide(Op.decide(one, "a", 1), EPOCH_US).remaining == 6
    master = fresh_sentinel_set.master()
    master.pause()
    try:
        with pytest.raises(StoreTimeout):
            store.decide(Op.decide(one, "a", 1), EPOCH_US)
        pooled = list(store.client.connection_pool._available_connections)
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


@pytest.mark.parametrize("algorithm", ["gcra", "token_bucket", "fixed_window", "sliding_window_log", "concurrency"])
def test_random_batches_decide_as_the_reference_applied_in_order(store: RedisStore, algorithm: str) -> None:
    """One script call carrying many ops (what coalescing sends): two rules of the same
    algorithm and limit count but other values, two keys, decides, peeks and refunds,
    the clock stepping back. main.lua parses a rule's limits once for consecutive ops of
    the same rule: a rule that differs only in its values must not be taken for it."""
    import random

    from refund_reference import refund_as_stores

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
                states[slot] = refund_as_stores(plan, states.get(slot), now, cost, lease)
                expected.append(None)
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
    NOSCRIPT) still splits, and an argument it cannot send is redis-py's DataError."""

    async def run() -> None:
        store = AsyncRedisStore(redis_server.url, prefix="rk:")
        connection = store.client.connection_pool.connection_class(host="127.0.0.1", port=redis_server.port)
        packed = b"".join(connection.pack_command("SCRIPT LOAD", "return 1"))
        assert packed == b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n$8\r\nreturn 1\r\n"
        with pytest.raises(redis.DataError):
            connection.pack_command("SET", "k", object())
        await store.client.script_flush()  # a private server: the next call meets NOSCRIPT, loads the script
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
    assert len(laned._lanes) == 1  # the lane is idle again, for the next slot holder
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
        lane = store._lanes[0] if store._lanes else None
        decisions = [store.decide(Op.decide(PLAN, "child", 1), EPOCH_US).remaining for _ in range(50)]
        results.put((decisions, store._lanes[0] is not lane))

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
