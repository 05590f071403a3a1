"""The guarantees of the coalescing (``ratekeeper.stores.coalescing``) on the real stores,
Redis and PostgreSQL, threads and asyncio.

Where a test must hold a call in flight, it wraps the store's lowest call (Redis
``shell.call``, PostgreSQL ``shell.execute``) with a gate: the first call after the warm-up waits
until the test opens the gate, then goes to the server. Threads and tasks are known to be queued
because the store's queue announces each op it takes (``observed_queue``). Every wait is
bounded: a store that wedges fails the test instead of hanging the suite. Each test has
its own key prefix (Redis) or schema (PostgreSQL).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from conformance.harness import POSTGRES_URL, REDIS_URL, delete_redis_keys, drop_schema
from ratekeeper import Decision, Rule
from ratekeeper.errors import StoreError, StoreTimeout
from ratekeeper.op import Op
from ratekeeper.stores import wire
from stores.observed_queue import ObservedCoalescer, finished

NOW = 1_763_870_000_000_000
BOUND = 5.0
"""The longest any wait in these tests may take."""
TIMEOUT = 0.5
"""The store's timeout in the tests that time out."""
MARGIN = 0.5
"""Scheduling slack on a busy machine: a timed-out call returns within TIMEOUT + MARGIN."""
LIMIT = 1000
PLAN = Rule("coalescing", [f"{LIMIT}/hour"], algorithm="fixed_window").plan

STORES = [
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-async", marks=pytest.mark.redis),
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("postgres-async", marks=pytest.mark.postgres),
]
SYNC_STORES = [p for p in STORES if not str(p.values[0]).endswith("-async")]
ASYNC_STORES = [p for p in STORES if str(p.values[0]).endswith("-async")]


class Interrupt(BaseException):
    """Stands for KeyboardInterrupt where it is raised in the main thread."""


@pytest.fixture
def place() -> Iterator[str]:
    """A name of this test's own: its Redis key prefix, or its PostgreSQL schema."""
    name = f"rk_coalescing_{uuid.uuid4().hex[:12]}"
    yield name
    with contextlib.suppress(Exception):
        delete_redis_keys(f"{name}:")
    with contextlib.suppress(Exception):
        drop_schema(name)


def open_store(kind: str, place: str, **options: Any) -> Any:
    if kind == "redis":
        from ratekeeper.stores.redis.store import RedisStore

        return RedisStore(REDIS_URL, prefix=f"{place}:", **options)
    if kind == "redis-async":
        from ratekeeper.stores.redis.store_async import AsyncRedisStore

        return AsyncRedisStore(REDIS_URL, prefix=f"{place}:", **options)
    if kind == "postgres":
        from ratekeeper.stores.postgres.store import PostgresStore

        return PostgresStore(f"{POSTGRES_URL}?schema={place}", **options)
    from ratekeeper.stores.postgres.store_async import AsyncPostgresStore

    return AsyncPostgresStore(f"{POSTGRES_URL}?schema={place}", **options)


def decide(key: str) -> Op:
    return Op.decide(PLAN, key, 1)


def observe(store: Any) -> ObservedCoalescer:
    """Swap the (idle) store's queue for an observed one with the same settings."""
    core = store._coalescer.core
    assert core.in_flight == 0 and not core.queue
    observed = ObservedCoalescer.like(core)
    store._coalescer.core = observed
    return observed


def lowest_call(store: Any) -> tuple[Any, str]:
    """What holds the store's lowest call, and its name."""
    return (store.shell, "call") if hasattr(store.shell, "call") else (store.shell, "execute")


class Gate:
    """Wraps a blocking store's lowest call: call 1 waits for ``opened``; ``fail[n]`` is raised
    instead of call n (in the thread making it)."""

    def __init__(self, store: Any) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.calls = 0
        self.fail: dict[int, BaseException] = {}
        owner, name = lowest_call(store)
        real = getattr(owner, name)

        def gated(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            n = self.calls
            if n == 1:
                self.entered.set()
                assert self.opened.wait(BOUND), "the gate was never opened"
            if n in self.fail:
                raise self.fail[n]
            return real(*args, **kwargs)

        setattr(owner, name, gated)


class AsyncGate:
    """``Gate`` for an asyncio store."""

    def __init__(self, store: Any) -> None:
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()
        self.calls = 0
        owner, name = lowest_call(store)
        real = getattr(owner, name)

        async def gated(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == 1:
                self.entered.set()
                await asyncio.wait_for(self.opened.wait(), BOUND)
            return await real(*args, **kwargs)

        setattr(owner, name, gated)


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = target()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def joined(*threads: threading.Thread) -> None:
    for thread in threads:
        thread.join(BOUND)
        assert not thread.is_alive(), "a thread waits forever"


@contextlib.contextmanager
def interrupted_when(ready: Callable[[], None]) -> Iterator[None]:
    """Raise ``Interrupt`` in the main thread (from a SIGUSR1 handler) once ``ready()`` returns
    in another thread; the signal is sent again until the handler ran (one that lands just
    before the main thread blocks on a lock is seen only when that wait ends)."""
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main
    hit = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if not hit.is_set():
            hit.set()
            raise Interrupt

    def interrupt() -> None:
        ready()
        deadline = time.monotonic() + BOUND
        while not hit.is_set() and time.monotonic() < deadline:
            signal.pthread_kill(main, signal.SIGUSR1)
            hit.wait(0.05)

    previous = signal.signal(signal.SIGUSR1, on_signal)
    sender = threading.Thread(target=interrupt, daemon=True)
    try:
        sender.start()
        yield
    finally:
        sender.join(BOUND)
        signal.signal(signal.SIGUSR1, previous)


def remaining(store: Any, key: str) -> int:
    return int(store.decide(Op.peek(PLAN, key, 0), NOW).remaining)


async def remaining_async(store: Any, key: str) -> int:
    return int((await store.decide(Op.peek(PLAN, key, 0), NOW)).remaining)


# -- 1. a queued caller waits at most the timeout ------------------------------------------------


@pytest.mark.parametrize("kind", SYNC_STORES)
def test_a_queued_thread_times_out_within_the_timeout_and_its_op_is_never_sent(kind: str, place: str) -> None:
    store = open_store(kind, place, max_in_flight=1, timeout=TIMEOUT)
    assert store.decide(decide("warm"), NOW).allowed  # connected (and the schema installed)
    gate = Gate(store)
    first, first_out = in_thread(lambda: store.decide(decide("k"), NOW))
    assert gate.entered.wait(BOUND)
    started = time.monotonic()
    with pytest.raises(StoreTimeout):
        store.decide(decide("k"), NOW)
    assert time.monotonic() - started < TIMEOUT + MARGIN
    gate.opened.set()
    joined(first)
    assert LIMIT - 1 == first_out["result"].remaining
    assert LIMIT - 1 == remaining(store, "k")  # the queued op charged nothing
    assert 2 == gate.calls  # the first call and the peek
    store.close()


@pytest.mark.parametrize("kind", ASYNC_STORES)
def test_a_queued_task_times_out_within_the_timeout_and_its_op_is_never_sent(kind: str, place: str) -> None:
    async def main() -> None:
        store = open_store(kind, place, max_in_flight=1, timeout=TIMEOUT)
        assert (await store.decide(decide("warm"), NOW)).allowed
        gate = AsyncGate(store)
        first = asyncio.ensure_future(store.decide(decide("k"), NOW))
        await asyncio.wait_for(gate.entered.wait(), BOUND)
        started = time.monotonic()
        with pytest.raises(StoreTimeout):
            await asyncio.wait_for(store.decide(decide("k"), NOW), BOUND)
        assert time.monotonic() - started < TIMEOUT + MARGIN
        with pytest.raises(StoreTimeout):  # its call hangs too: every asyncio caller has the deadline
            await asyncio.wait_for(first, BOUND)
        gate.opened.set()
        assert LIMIT - 1 == await remaining_async(store, "k")  # the first op went out; the queued one did not
        assert 2 == gate.calls
        await store.aclose()

    asyncio.run(main())


@pytest.mark.postgres
@pytest.mark.parametrize("asynchronous", [False, True], ids=["threads", "asyncio"])
def test_postgres_callers_queued_behind_a_statement_held_by_a_row_lock_get_store_timeout(
    asynchronous: bool, place: str
) -> None:
    """Another session holds the row's lock in an open transaction: the statement in flight
    waits for it until its timeout, and the callers queued behind it (its row is busy) get
    StoreTimeout within the store's timeout, never a statement of their own (before: they
    waited without a bound, each then sending a statement that waited again)."""
    kind = "postgres-async" if asynchronous else "postgres"
    store = open_store(kind, place, timeout=TIMEOUT)
    key = "locked"
    storage_key = wire.storage_key("", PLAN, key)
    in_flight = threading.Event()
    in_flight_async: list[asyncio.Event] = []  # made inside the loop
    sent: list[int] = []
    real = store.shell.execute

    def counted(*args: Any, **kwargs: Any) -> Any:
        sent.append(1)
        in_flight.set()
        return real(*args, **kwargs)

    async def counted_async(*args: Any, **kwargs: Any) -> Any:
        sent.append(1)
        in_flight_async[0].set()
        return await real(*args, **kwargs)

    async def behind_one_in_flight(n: int) -> tuple[list[Any], float]:
        """One call, then ``n`` more once its statement is out: (their outcomes, how long)."""
        if asynchronous:
            in_flight_async.append(asyncio.Event())
            first = asyncio.ensure_future(store.decide(decide(key), NOW))
            await asyncio.wait_for(in_flight_async[0].wait(), BOUND)
            started = time.monotonic()
            results = await asyncio.wait_for(
                asyncio.gather(first, *(store.decide(decide(key), NOW) for _ in range(n)), return_exceptions=True),
                BOUND,
            )
        else:
            threads = [in_thread(lambda: store.decide(decide(key), NOW))]
            assert in_flight.wait(BOUND)
            started = time.monotonic()
            threads += [in_thread(lambda: store.decide(decide(key), NOW)) for _ in range(n)]
            joined(*(t for t, _ in threads))
            results = [out.get("error", out.get("result")) for _, out in threads]
        return results, time.monotonic() - started

    async def main() -> None:
        first = store.decide(decide(key), NOW)
        assert (await first if asynchronous else first).allowed  # the row exists
        store.shell.execute = counted_async if asynchronous else counted
        with psycopg.connect(POSTGRES_URL, connect_timeout=5) as locker:
            locker.execute(f"SELECT 1 FROM {place}.state WHERE key = %s FOR UPDATE", (storage_key,))
            try:
                results, took = await behind_one_in_flight(3)
            finally:
                locker.rollback()
        assert [StoreTimeout] * 4 == [type(r) for r in results]
        assert took < TIMEOUT + MARGIN
        assert 1 == len(sent)  # one statement; the callers queued behind it sent none
        again = store.decide(Op.peek(PLAN, key, 0), NOW)
        assert LIMIT - 1 == (await again if asynchronous else again).remaining  # nothing charged
        if asynchronous:
            await store.aclose()
        else:
            store.close()

    asyncio.run(main())


# -- 2. an error reaches only the calls it concerns ----------------------------------------------


@pytest.mark.redis
def test_a_cluster_slot_whose_call_failed_fails_only_the_callers_of_that_slot(
    redis_cluster_url: str, key_prefix: str
) -> None:
    from redis.crc import key_slot

    from ratekeeper.stores.redis.store import RedisStore

    store = RedisStore(redis_cluster_url, prefix=f"{key_prefix}:", max_in_flight=1, timeout=2.0)
    queue = observe(store)
    keys: list[str] = []
    for i in range(100):  # two keys on different slots
        key = f"user-{i}"
        if not keys or key_slot(store.planner.storage_key(PLAN, key).encode()) != key_slot(
            store.planner.storage_key(PLAN, keys[0]).encode()
        ):
            keys.append(key)
        if len(keys) == 2:
            break
    good, bad = keys
    store.shell.client.set(store.planner.storage_key(PLAN, bad), b"\xc1 not msgpack")  # that slot's call fails
    entered, opened = threading.Event(), threading.Event()
    send = store.shell.call

    def gated(*args: Any, **kwargs: Any) -> Any:
        if not entered.is_set():
            entered.set()
            assert opened.wait(BOUND)
        return send(*args, **kwargs)

    store.shell.call = gated
    first, first_out = in_thread(lambda: store.decide(decide("first"), NOW))
    assert entered.wait(BOUND)
    callers = []
    for i, key in enumerate((good, bad), 1):
        callers.append(in_thread(lambda key=key: store.decide(decide(key), NOW)))  # type: ignore[misc]
        queue.wait_queued(i)
    opened.set()
    joined(first, *(t for t, _ in callers))
    assert first_out["result"].allowed
    assert callers[0][1]["result"].allowed  # its slot's call ran
    assert isinstance(callers[1][1]["error"], StoreError)
    store.shell.client.delete(*(store.planner.storage_key(PLAN, k) for k in ("first", good, bad)))
    store.close()


# -- 3. an interruption is its own caller's ------------------------------------------------------


@pytest.mark.parametrize("kind", SYNC_STORES)
def test_an_interrupt_of_the_thread_sending_a_call_reaches_the_others_as_a_store_error(kind: str, place: str) -> None:
    store = open_store(kind, place, max_in_flight=1, timeout=BOUND)
    assert store.decide(decide("warm"), NOW).allowed
    queue = observe(store)
    gate = Gate(store)
    gate.fail[2] = KeyboardInterrupt()  # in the thread sending the second call
    first, first_out = in_thread(lambda: store.decide(decide("k"), NOW))
    assert gate.entered.wait(BOUND)
    callers = []
    for i in range(1, 4):
        callers.append(in_thread(lambda: store.decide(decide("k"), NOW)))
        queue.wait_queued(i)
    gate.opened.set()
    joined(first, *(t for t, _ in callers))
    assert first_out["result"].allowed
    errors = [out["error"] for _, out in callers]
    assert [KeyboardInterrupt, StoreError, StoreError] == [type(e) for e in errors]  # the first queued led
    assert all(e.__cause__ is errors[0] for e in errors[1:])
    assert 0 == store._coalescer.core.in_flight
    assert LIMIT - 2 == store.decide(decide("k"), NOW).remaining  # still deciding; the interrupted call sent nothing
    store.close()


@pytest.mark.parametrize("kind", SYNC_STORES)
def test_a_thread_interrupted_while_queued_hands_its_place_on_and_charges_nothing(kind: str, place: str) -> None:
    store = open_store(kind, place, max_in_flight=1, timeout=BOUND)
    assert store.decide(decide("warm"), NOW).allowed
    queue = observe(store)
    gate = Gate(store)
    first, first_out = in_thread(lambda: store.decide(decide("k"), NOW))
    assert gate.entered.wait(BOUND)
    with interrupted_when(lambda: queue.wait_queued(1)), pytest.raises(Interrupt):
        store.decide(decide("k"), NOW)
    later, later_out = in_thread(lambda: store.decide(decide("k"), NOW))
    queue.wait_queued(1)
    gate.opened.set()
    joined(first, later)
    assert [LIMIT - 1, LIMIT - 2] == [first_out["result"].remaining, later_out["result"].remaining]
    assert 0 == store._coalescer.core.in_flight
    assert LIMIT - 2 == remaining(store, "k")
    store.close()


@pytest.mark.parametrize("kind", ASYNC_STORES)
def test_a_cancelled_call_reaches_its_callers_as_a_store_error_never_a_cancellation(kind: str, place: str) -> None:
    async def main() -> None:
        store = open_store(kind, place, max_in_flight=1, timeout=BOUND)
        assert (await store.decide(decide("warm"), NOW)).allowed
        gate = AsyncGate(store)
        callers = [asyncio.ensure_future(store.decide(decide("k"), NOW)) for _ in range(2)]
        await asyncio.wait_for(gate.entered.wait(), BOUND)
        (task,) = store._coalescer.tasks
        task.cancel()
        results = await asyncio.wait_for(asyncio.gather(*callers, return_exceptions=True), BOUND)
        assert [StoreError, StoreError] == [type(r) for r in results]
        assert all(isinstance(r.__cause__, asyncio.CancelledError) for r in results)
        gate.opened.set()
        assert 0 == store._coalescer.core.in_flight
        assert (await store.decide(decide("k"), NOW)).allowed
        await store.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ASYNC_STORES)
def test_a_task_cancelled_before_its_op_is_sent_charges_nothing_after_leaves_the_call_to_others(
    kind: str, place: str
) -> None:
    async def main() -> None:
        store = open_store(kind, place, max_in_flight=1, timeout=BOUND)
        assert (await store.decide(decide("warm"), NOW)).allowed
        queue = observe(store)
        gate = AsyncGate(store)
        sent = asyncio.ensure_future(store.decide(decide("k"), NOW))
        companion = asyncio.ensure_future(store.decide(decide("k"), NOW))  # the same call
        await asyncio.wait_for(gate.entered.wait(), BOUND)
        queued = [asyncio.ensure_future(store.decide(decide("k"), NOW)) for _ in range(3)]
        await queue.queued(3)
        sent.cancel()  # its op is out: the call goes on for the companion
        queued[1].cancel()  # its op is still queued: withdrawn
        await finished(sent, queued[1])
        gate.opened.set()
        done = await asyncio.wait_for(asyncio.gather(companion, queued[0], queued[2]), BOUND)
        assert [LIMIT - 2, LIMIT - 3, LIMIT - 4] == [d.remaining for d in done]
        assert LIMIT - 4 == await remaining_async(store, "k")
        assert 0 == store._coalescer.core.in_flight
        await store.aclose()

    asyncio.run(main())


@pytest.mark.postgres
def test_an_async_postgres_store_used_on_a_second_event_loop_says_so(place: str) -> None:
    store = open_store("postgres-async", place, timeout=BOUND)

    async def once() -> bool:
        return bool((await asyncio.wait_for(store.decide(decide("k"), NOW), BOUND)).allowed)

    async def main() -> None:
        assert await once()
        other, out = in_thread(lambda: asyncio.run(once()))
        await asyncio.to_thread(other.join, BOUND)
        assert isinstance(out.get("error"), RuntimeError)
        assert "another event loop" in str(out["error"])
        assert await once()
        await store.aclose()

    asyncio.run(main())


# -- 2. an op the client cannot encode fails its own caller alone ------------------------------
#
# The limiters refuse such a key at the call (tests/conformance/test_keys.py); these ops go to
# the store directly, past the limiter, to prove the coalescer's own guarantee.

BAD_KEY = "bad-\ud800"


@pytest.mark.parametrize("kind", SYNC_STORES)
def test_an_op_the_client_cannot_encode_fails_its_own_thread_alone_in_a_shared_call(kind: str, place: str) -> None:
    store = open_store(kind, place, max_in_flight=1, timeout=BOUND)
    assert store.decide(decide("warm"), NOW).allowed
    queue = observe(store)
    gate = Gate(store)
    first, first_out = in_thread(lambda: store.decide(decide("k"), NOW))
    assert gate.entered.wait(BOUND)
    callers = []
    for i, key in enumerate(["k", BAD_KEY, "k", "other"], 1):  # queued: they go in one call
        # the store's entry refuses the bad key (stores.bounds): past it, as if it slipped by
        enter = store._submit if key == BAD_KEY else store.decide
        callers.append(in_thread(lambda key=key, enter=enter: enter(decide(key), NOW)))  # type: ignore[misc]
        queue.wait_queued(i)
    gate.opened.set()
    joined(first, *(t for t, _ in callers))
    outs = [out for _, out in callers]
    assert LIMIT - 1 == first_out["result"].remaining
    assert isinstance(outs[1].get("error"), UnicodeEncodeError)  # its own error, not a StoreError
    assert [LIMIT - 2, LIMIT - 3, LIMIT - 1] == [outs[i]["result"].remaining for i in (0, 2, 3)]
    assert LIMIT - 3 == remaining(store, "k")  # each good op charged once
    assert 0 == store._coalescer.core.in_flight
    store.close()


@pytest.mark.parametrize("kind", ASYNC_STORES)
def test_an_op_the_client_cannot_encode_fails_its_own_task_alone_in_a_shared_call(kind: str, place: str) -> None:
    async def main() -> None:
        store = open_store(kind, place, max_in_flight=1, timeout=BOUND)
        assert (await store.decide(decide("warm"), NOW)).allowed
        queue = observe(store)
        gate = AsyncGate(store)
        first = asyncio.ensure_future(store.decide(decide("k"), NOW))
        await asyncio.wait_for(gate.entered.wait(), BOUND)
        # the store's entry refuses the bad key (stores.bounds): past it, as if it slipped by
        queued = [
            asyncio.ensure_future((store._submit if key == BAD_KEY else store.decide)(decide(key), NOW))
            for key in ["k", BAD_KEY, "k", "other"]
        ]
        await queue.queued(4)
        gate.opened.set()
        results = await asyncio.wait_for(asyncio.gather(first, *queued, return_exceptions=True), BOUND)
        assert isinstance(results[2], UnicodeEncodeError)
        decided = [r for i, r in enumerate(results) if i != 2]
        assert all(isinstance(r, Decision) for r in decided)
        assert [LIMIT - 1, LIMIT - 2, LIMIT - 3, LIMIT - 1] == [r.remaining for r in decided if isinstance(r, Decision)]
        assert LIMIT - 3 == await remaining_async(store, "k")
        assert 0 == store._coalescer.core.in_flight
        await store.aclose()

    asyncio.run(main())
