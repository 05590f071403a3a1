"""Coalesced callers of the Redis store (threads and asyncio): the hand-off never wedges,
a queued caller waits at most its timeout, an error reaches every caller of its call, an
interrupted or cancelled caller charges nothing and leaves the call to the others.

The store talks to the real Redis; where a test must hold a call in flight, it wraps the
store's ``shell.call`` (one script call) with a gate (the call still goes to Redis once the
gate opens). Every wait here is bounded, so a wedged store fails the test instead of
hanging the suite.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
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
from stores.observed_queue import ObservedCoalescer, finished

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
    """Wraps a sync store's ``shell.call``: calls block until ``open`` (at most BOUND); counts ops sent."""

    def __init__(self, store: Any, fail_with: BaseException | None = None) -> None:
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.ops: list[int] = []
        self.fail_with = fail_with
        send = store.shell.call

        def gated(call: Any, client: Any = None) -> Any:
            self.ops.append(int(call.args[2]))
            self.entered.set()
            assert self.opened.wait(BOUND), "the gate was never opened"
            if self.fail_with is not None:
                exc, self.fail_with = self.fail_with, None
                raise exc
            return send(call, client)

        store.shell.call = gated


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
    (it is never made the lead of a call it would not send, which would leave every thread
    queued with it waiting)."""
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
    store's timeout (not as long as the call in flight), and its op is withdrawn, so it
    charges nothing."""
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
    send = store.shell.call
    calls: list[int] = []

    def scripted(call: Any, client: Any = None) -> Any:
        calls.append(int(call.args[2]))
        if len(calls) == 1:
            entered.set()
            assert opened.wait(BOUND)
        elif len(calls) == 2:
            raise Interrupt
        return send(call, client)

    store.shell.call = scripted  # type: ignore[method-assign]
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
    send = store.shell.call

    def counted(call: Any, client: Any = None) -> Any:
        sent.append(1)
        return send(call, client)

    store.shell.call = counted  # type: ignore[method-assign]
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
    """Wraps an async store's ``shell.call``: calls wait until ``opened`` is set; counts ops sent."""

    def __init__(self, store: AsyncRedisStore, fail_with: BaseException | None = None) -> None:
        self.opened = asyncio.Event()
        self.entered = asyncio.Event()
        self.ops: list[int] = []
        self.fail_with = fail_with
        send = store.shell.call

        async def gated(call: Any, client: Any = None) -> Any:
            self.ops.append(int(call.args[2]))
            self.entered.set()
            await asyncio.wait_for(self.opened.wait(), BOUND)
            if self.fail_with is not None:
                exc, self.fail_with = self.fail_with, None
                raise exc
            return await send(call, client)

        store.shell.call = gated  # type: ignore[method-assign]


async def _warm_and_observe(store: AsyncRedisStore) -> ObservedCoalescer:
    """One decision (its key apart from the tests'), then the store's idle queue swapped for
    an observed one, so the test waits for what it needs (a call at the gate, ops queued)."""
    assert (await store.decide(Op.decide(PLAN, "warm", 1), EPOCH_US)).allowed
    core = store._coalescer.core
    assert core.in_flight == 0 and not core.queue
    observed = ObservedCoalescer.like(core)
    store._coalescer.core = observed
    return observed


async def _entered(gate: _AsyncGate) -> None:
    """Wait until a call reached the gate, then re-arm for the next one."""
    await asyncio.wait_for(gate.entered.wait(), BOUND)
    gate.entered.clear()


def test_a_caller_cancelled_while_queued_charges_nothing_and_the_others_are_answered(key_prefix: str) -> None:
    async def run() -> None:
        store = AsyncRedisStore(URL, prefix=f"{key_prefix}:", max_in_flight=1)
        queue = await _warm_and_observe(store)
        gate = _AsyncGate(store)
        first = asyncio.ensure_future(store.decide(Op.decide(PLAN, "k", 1), EPOCH_US))
        await _entered(gate)
        queued = [asyncio.ensure_future(store.decide(Op.decide(PLAN, "k", 1), EPOCH_US)) for _ in range(3)]
        await queue.queued(3)
        queued[1].cancel()
        await finished(queued[1])  # its op stays queued, skipped when the call is made
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
        queue = await _warm_and_observe(store)
        gate = _AsyncGate(store)
        callers = [asyncio.ensure_future(store.decide(Op.decide(PLAN, "k", 1), EPOCH_US)) for _ in range(3)]
        await _entered(gate)
        assert queue.taken == 1 and not queue.queue  # the three ops are in flight as one call
        callers[0].cancel()
        await finished(callers[0])
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
        queue = await _warm_and_observe(store)
        gate = _AsyncGate(store, fail_with=StoreError("boom"))
        callers = [asyncio.ensure_future(store.decide(Op.decide(PLAN, f"k{i}", 1), EPOCH_US)) for i in range(4)]
        await _entered(gate)
        assert queue.taken == 1 and not queue.queue  # the four ops went out as one call
        gate.opened.set()
        results = await asyncio.wait_for(asyncio.gather(*callers, return_exceptions=True), BOUND)
        assert [str(r) for r in results] == ["boom"] * 4
        gate.opened.clear()
        callers = [asyncio.ensure_future(store.decide(Op.decide(PLAN, f"k{i}", 1), EPOCH_US)) for i in range(2)]
        await _entered(gate)
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
    says what to do (not "Event loop is closed" from redis-py, nor a hang when the first
    loop left a flush scheduled)."""
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
            deadline = time.monotonic() + BOUND
            while store._coalescer.core.in_flight < 1:  # the first call is in flight; the rest queue behind it
                assert time.monotonic() < deadline, "the first call never went out"
                await asyncio.sleep(0)
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
    assert client.exists(store.planner.storage_key(PLAN, "k")) == 1
    client.close()
    store.close()
