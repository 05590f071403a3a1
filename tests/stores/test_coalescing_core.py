"""The coalescing of the server stores without a server: the sans-IO ``Coalescer`` and its
thread and asyncio drivers over fake ``run`` functions (``ratekeeper.stores.coalescing``).

Ordering is controlled, never slept for: a fake call blocks on an Event until the test
opens it, and the queue announces each op it takes and each call it starts
(``observed_queue``), so a test knows when its threads or tasks are queued. Every wait
is bounded by ``BOUND``: a driver that wedges fails the test instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from ratekeeper.errors import StoreError, StoreTimeout
from ratekeeper.stores import coalescing_threads
from ratekeeper.stores.coalescing import Coalescer
from ratekeeper.stores.coalescing_asyncio import AsyncCoalescer
from ratekeeper.stores.coalescing_threads import ThreadCoalescer
from stores.observed_queue import ObservedCoalescer, finished

BOUND = 5.0
"""The longest any wait in these tests may take."""
MARGIN = 0.5
"""Scheduling slack on a busy machine for the timeout bounds (a correctness bound)."""


def row_of(op: str) -> str:
    """The ops of these tests are strings ``"row.n"``: their row is the part before the dot."""
    return op.partition(".")[0]


class Interrupt(BaseException):
    """Stands for KeyboardInterrupt."""


class Down(StoreError):
    """A failure that says the store is down (the fake ``store_down`` says so)."""


def down(exc: BaseException) -> bool:
    return isinstance(exc, Down)


# -- the sans-IO core ---------------------------------------------------------------------------


def queued(core: Coalescer[str, str]) -> list[str]:
    return [waiter for _, _, waiter in core.queue]


def test_a_call_takes_the_oldest_ops_that_share_the_oldest_ones_now_in_order() -> None:
    core: Coalescer[str, str] = Coalescer(max_in_flight=4, max_batch=256, row=row_of)
    for op, now in [("a.1", 1), ("b.1", 2), ("c.1", 1), ("a.2", 1)]:
        core.push(op, now, op)
    assert (["a.1", "c.1", "a.2"], 1, ["a.1", "c.1", "a.2"]) == core.take()
    assert (["b.1"], 2, ["b.1"]) == core.take()
    assert 2 == core.in_flight
    assert core.take() is None


def test_an_op_waiting_for_another_now_keeps_the_later_ops_of_its_row_back() -> None:
    core: Coalescer[str, str] = Coalescer(max_in_flight=4, max_batch=256, row=row_of)
    for op, now in [("a.1", 1), ("b.1", 2), ("b.2", 1), ("c.1", 1)]:
        core.push(op, now, op)
    assert (["a.1", "c.1"], 1, ["a.1", "c.1"]) == core.take()  # b.2 must not overtake b.1
    assert (["b.1"], 2, ["b.1"]) == core.take()
    assert (["b.2"], 1, ["b.2"]) == core.take()


def test_without_rows_no_op_overtakes_one_that_waits_for_another_now() -> None:
    core: Coalescer[str, str] = Coalescer(max_in_flight=4, max_batch=256)
    for op, now in [("a.1", 1), ("b.1", 2), ("c.1", 1)]:
        core.push(op, now, op)
    assert (["a.1"], 1, ["a.1"]) == core.take()
    assert (["b.1"], 2, ["b.1"]) == core.take()
    assert (["c.1"], 1, ["c.1"]) == core.take()


def test_a_call_takes_at_most_max_batch_ops_and_the_rest_keep_their_order() -> None:
    core: Coalescer[str, str] = Coalescer(max_in_flight=4, max_batch=2)
    for i in range(5):
        core.push(f"k.{i}", None, f"k.{i}")
    taken = [core.take() for _ in range(3)]
    assert [["k.0", "k.1"], ["k.2", "k.3"], ["k.4"]] == [t[0] for t in taken if t is not None]


def test_no_more_than_max_in_flight_calls_and_a_lone_op_goes_only_with_nothing_queued() -> None:
    core: Coalescer[str, str] = Coalescer(max_in_flight=1, max_batch=256)
    assert core.start_alone("a.1")
    assert not core.start_alone("b.1")  # the one slot is taken
    core.push("b.1", None, "b.1")
    assert core.take() is None
    core.finish(["a.1"])
    assert not core.start_alone("c.1")  # a free slot, but b.1 is queued: it goes first
    assert (["b.1"], None, ["b.1"]) == core.take()


def test_with_one_call_per_row_a_busy_rows_ops_wait_and_then_go_together_in_order() -> None:
    core: Coalescer[str, str] = Coalescer(max_in_flight=4, max_batch=256, row=row_of, one_call_per_row=True)
    assert core.start_alone("hot.0")
    assert not core.start_alone("hot.1")  # one call per row at a time
    for name in ("hot.1", "hot.2", "hot.3"):
        core.push(name, None, name)
    assert core.take() is None  # the row is busy
    core.finish(["hot.0"])
    assert (["hot.1", "hot.2", "hot.3"], None, ["hot.1", "hot.2", "hot.3"]) == core.take()
    assert 1 == core.in_flight
    assert not core.queue


def test_with_one_call_per_row_other_rows_go_past_a_busy_one_but_a_rows_order_holds() -> None:
    core: Coalescer[str, str] = Coalescer(max_in_flight=4, max_batch=256, row=row_of, one_call_per_row=True)
    assert core.start_alone("a.0")
    for name in ("a.1", "b.1", "a.2"):
        core.push(name, None, name)
    assert (["b.1"], None, ["b.1"]) == core.take()
    assert ["a.1", "a.2"] == queued(core)
    assert not core.start_alone("c.1")  # something is queued: a newcomer queues too


def test_withdraw_and_drain_take_ops_out_of_the_queue() -> None:
    core: Coalescer[str, str] = Coalescer(max_in_flight=1, max_batch=256)
    for name in ("k.1", "k.2", "k.3", "k.4"):
        core.push(name, None, name)
    assert core.withdraw("k.2")
    assert not core.withdraw("k.2")
    assert (["k.1", "k.3", "k.4"], None, ["k.1", "k.3", "k.4"]) == core.take()
    core.push("k.5", None, "k.5")
    assert ["k.5"] == core.drain()
    assert not core.queue


def test_one_call_per_row_needs_the_row_function() -> None:
    with pytest.raises(ValueError, match="row"):
        Coalescer(max_in_flight=1, max_batch=1, one_call_per_row=True)


# -- the thread driver ---------------------------------------------------------------------------


class FakeStore:
    """A fake ``run``: records each call's ops, answers ``"<op>!"`` per op; a call whose number
    is held (``hold(n)``) blocks until released; ``script[n]`` replaces call n's answer."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.lock = threading.Lock()
        self.held: dict[int, tuple[threading.Event, threading.Event]] = {}
        self.script: dict[int, Callable[[Sequence[str]], list[Any]]] = {}

    def hold(self, n: int) -> tuple[threading.Event, threading.Event]:
        """(entered, release) of call number ``n`` (1-based)."""
        self.held[n] = (threading.Event(), threading.Event())
        return self.held[n]

    def __call__(self, ops: Sequence[str], now: int | None) -> list[Any]:
        with self.lock:
            self.calls.append(list(ops))
            n = len(self.calls)
        if n in self.held:
            entered, release = self.held[n]
            entered.set()
            assert release.wait(BOUND), f"call {n} was never released"
        if n in self.script:
            return self.script[n](ops)
        return [f"{op}!" for op in ops]


def threads_over(
    fake: FakeStore, max_in_flight: int = 1, timeout: float = BOUND, rows: bool = False, max_batch: int = 256
) -> ThreadCoalescer[str, Any]:
    core = ObservedCoalescer(max_in_flight, max_batch, row_of if rows else None, one_call_per_row=rows)
    return ThreadCoalescer(core, fake, down, timeout, "the fake store")


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


def observed(driver: ThreadCoalescer[str, Any] | AsyncCoalescer[str, Any]) -> ObservedCoalescer:
    assert isinstance(driver.core, ObservedCoalescer)
    return driver.core


@contextlib.contextmanager
def interrupted_when(ready: Callable[[], None]) -> Iterator[None]:
    """Interrupt the main thread (an ``Interrupt`` raised by a SIGUSR1 handler) once
    ``ready()`` returns in another thread. The signal is sent again until the handler ran:
    one that lands just before the main thread blocks on a lock is only seen when the lock
    wait ends."""
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


def test_a_lone_caller_sends_at_once_from_its_own_thread_without_a_waiter(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[object] = []

    class CountedWaiter(coalescing_threads._Waiter):
        def __init__(self) -> None:
            made.append(self)
            super().__init__()

    monkeypatch.setattr(coalescing_threads, "_Waiter", CountedWaiter)
    fake = FakeStore()
    driver = threads_over(fake)
    assert ["a.1!", "a.2!"] == [driver.submit("a.1", None), driver.submit("a.2", None)]
    assert [["a.1"], ["a.2"]] == fake.calls
    assert [] == made
    assert (0, 0) == (driver.core.in_flight, len(driver.core.queue))


def test_callers_queued_behind_a_call_go_together_in_arrival_order_each_with_its_result() -> None:
    fake = FakeStore()
    entered, release = fake.hold(1)
    driver = threads_over(fake)
    first, first_out = in_thread(lambda: driver.submit("k.0", None))
    assert entered.wait(BOUND)
    outs = []
    for i in range(1, 4):  # one at a time, so that their arrival order is known
        outs.append(in_thread(lambda i=i: driver.submit(f"k.{i}", None)))  # type: ignore[misc]
        observed(driver).wait_queued(i)
    release.set()
    joined(first, *(t for t, _ in outs))
    assert [["k.0"], ["k.1", "k.2", "k.3"]] == fake.calls
    assert ["k.0!", "k.1!", "k.2!", "k.3!"] == [first_out["result"], *(out["result"] for _, out in outs)]
    assert (0, 0) == (driver.core.in_flight, len(driver.core.queue))


def test_a_queued_caller_times_out_after_the_timeout_and_its_op_is_never_sent() -> None:
    fake = FakeStore()
    entered, release = fake.hold(1)
    driver = threads_over(fake, timeout=0.2)
    first, first_out = in_thread(lambda: driver.submit("k.0", None))
    assert entered.wait(BOUND)
    started = time.monotonic()
    with pytest.raises(StoreTimeout, match="the fake store did not answer in time"):
        driver.submit("k.1", None)
    assert time.monotonic() - started < 0.2 + MARGIN
    release.set()
    joined(first)
    assert "k.0!" == first_out["result"]
    assert "k.2!" == driver.submit("k.2", None)
    assert [["k.0"], ["k.2"]] == fake.calls  # k.1 was withdrawn
    assert (0, 0) == (driver.core.in_flight, len(driver.core.queue))


def test_a_caller_whose_op_was_sent_times_out_too_and_its_answer_is_dropped() -> None:
    fake = FakeStore()
    entered1, release1 = fake.hold(1)
    entered2, release2 = fake.hold(2)
    driver = threads_over(fake, timeout=0.5)
    first, first_out = in_thread(lambda: driver.submit("k.0", None))
    assert entered1.wait(BOUND)
    lead, lead_out = in_thread(lambda: driver.submit("k.1", None))
    observed(driver).wait_queued(1)
    follower, follower_out = in_thread(lambda: driver.submit("k.2", None))
    observed(driver).wait_queued(2)
    release1.set()
    assert entered2.wait(BOUND)  # the second call (k.1, k.2) is out and hangs
    joined(follower)
    assert isinstance(follower_out["error"], StoreTimeout)
    release2.set()
    joined(first, lead)
    assert ["k.0!", "k.1!"] == [first_out["result"], lead_out["result"]]
    assert [["k.0"], ["k.1", "k.2"]] == fake.calls
    assert 0 == driver.core.in_flight


def test_a_result_that_is_a_store_error_reaches_only_its_own_caller() -> None:
    fake = FakeStore()
    entered, release = fake.hold(1)
    fake.script[2] = lambda ops: [f"{ops[0]}!", StoreError("slot 2 failed"), f"{ops[2]}!"]
    driver = threads_over(fake)
    first, _ = in_thread(lambda: driver.submit("a.0", None))
    assert entered.wait(BOUND)
    outs = []
    for i, op in enumerate(["a.1", "b.1", "c.1"], 1):
        outs.append(in_thread(lambda op=op: driver.submit(op, None)))  # type: ignore[misc]
        observed(driver).wait_queued(i)
    release.set()
    joined(first, *(t for t, _ in outs))
    assert "a.1!" == outs[0][1]["result"]
    assert "slot 2 failed" == str(outs[1][1]["error"])
    assert "c.1!" == outs[2][1]["result"]


def test_a_failed_call_fails_its_own_callers_and_the_queued_ones_get_a_call_of_their_own() -> None:
    fake = FakeStore()
    entered, release = fake.hold(1)
    fake.script[1] = lambda ops: (_ for _ in ()).throw(StoreError("this call failed"))
    driver = threads_over(fake)
    first, first_out = in_thread(lambda: driver.submit("k.0", None))
    assert entered.wait(BOUND)
    queued_, queued_out = in_thread(lambda: driver.submit("k.1", None))
    observed(driver).wait_queued(1)
    release.set()
    joined(first, queued_)
    assert "this call failed" == str(first_out["error"])
    assert "k.1!" == queued_out["result"]
    assert [["k.0"], ["k.1"]] == fake.calls


def test_callers_queued_behind_a_call_that_found_the_store_down_get_its_error_at_once() -> None:
    fake = FakeStore()
    entered, release = fake.hold(1)
    failure = Down("the store is unreachable")
    fake.script[1] = lambda ops: (_ for _ in ()).throw(failure)
    driver = threads_over(fake)
    first, first_out = in_thread(lambda: driver.submit("k.0", None))
    assert entered.wait(BOUND)
    outs = []
    for i in range(1, 4):
        outs.append(in_thread(lambda i=i: driver.submit(f"k.{i}", None)))  # type: ignore[misc]
        observed(driver).wait_queued(i)
    release.set()
    joined(first, *(t for t, _ in outs))
    assert [failure] * 4 == [first_out["error"], *(out["error"] for _, out in outs)]
    assert [["k.0"]] == fake.calls  # no call of their own
    assert "k.9!" == driver.submit("k.9", None)


def test_an_interrupt_of_the_thread_sending_a_call_is_its_own_the_others_get_a_store_error() -> None:
    fake = FakeStore()
    entered, release = fake.hold(1)
    fake.script[2] = lambda ops: (_ for _ in ()).throw(Interrupt())
    driver = threads_over(fake)
    first, first_out = in_thread(lambda: driver.submit("k.0", None))
    assert entered.wait(BOUND)
    outs = []
    for i in range(1, 4):
        outs.append(in_thread(lambda i=i: driver.submit(f"k.{i}", None)))  # type: ignore[misc]
        observed(driver).wait_queued(i)
    release.set()
    joined(first, *(t for t, _ in outs))
    assert "k.0!" == first_out["result"]
    errors = [out["error"] for _, out in outs]
    assert [Interrupt, StoreError, StoreError] == [type(e) for e in errors]  # k.1 led the call
    assert all(isinstance(e.__cause__, Interrupt) for e in errors[1:])
    assert "outcome is unknown" in str(errors[1])
    assert (0, 0) == (driver.core.in_flight, len(driver.core.queue))
    assert "k.4!" == driver.submit("k.4", None)


def test_a_thread_interrupted_while_queued_hands_its_place_on_and_its_op_is_not_sent() -> None:
    fake = FakeStore()
    entered, release = fake.hold(1)
    driver = threads_over(fake)
    first, first_out = in_thread(lambda: driver.submit("k.0", None))
    assert entered.wait(BOUND)
    observe = observed(driver)
    with interrupted_when(lambda: observe.wait_queued(1)), pytest.raises(Interrupt):
        driver.submit("k.1", None)
    assert 0 == len(driver.core.queue)
    later, later_out = in_thread(lambda: driver.submit("k.2", None))
    observed(driver).wait_queued(1)
    release.set()
    joined(first, later)
    assert ["k.0!", "k.2!"] == [first_out["result"], later_out["result"]]
    assert [["k.0"], ["k.2"]] == fake.calls
    assert 0 == driver.core.in_flight


def test_a_lead_that_leaves_before_sending_hands_the_call_to_the_next_caller_of_it() -> None:
    """The first caller of a call stops waiting (timed out) just as the call is handed to
    it: the next caller of that call sends it, without the leaver's op."""
    fake = FakeStore()
    driver = threads_over(fake)
    core = driver.core
    leaver, heir = coalescing_threads._Waiter(), coalescing_threads._Waiter()
    assert core.start_alone("k.0")
    core.push("k.1", None, leaver)
    core.push("k.2", None, heir)
    driver._finish(["k.0"], None)  # the call of k.0 returned: k.1 and k.2 go, led by k.1's caller
    assert leaver.lead is not None
    assert not driver._withdraw(leaver)  # ... which left meanwhile
    assert leaver.gone and heir.lead is not None
    assert heir.signal.acquire(False)  # woken to lead
    assert "k.2!" == driver._lead(heir)
    assert [["k.2"]] == fake.calls
    assert 0 == core.in_flight


def test_with_one_call_per_row_a_busy_rows_ops_wait_while_another_rows_op_goes() -> None:
    fake = FakeStore()
    entered, release = fake.hold(1)
    driver = threads_over(fake, max_in_flight=2, rows=True)
    first, first_out = in_thread(lambda: driver.submit("a.0", None))
    assert entered.wait(BOUND)
    same, same_out = in_thread(lambda: driver.submit("a.1", None))
    observed(driver).wait_queued(1)  # its row is busy, though a slot is free
    assert "b.0!" == driver.submit("b.0", None)  # another row: a call of its own at once
    release.set()
    joined(first, same)
    assert ["a.0!", "a.1!"] == [first_out["result"], same_out["result"]]
    assert [["a.0"], ["b.0"], ["a.1"]] == fake.calls


# -- the asyncio driver ---------------------------------------------------------------------------


class AsyncFake:
    """The asyncio ``FakeStore``: call ``n`` waits for ``release[n]`` when held."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.held: dict[int, tuple[asyncio.Event, asyncio.Event]] = {}
        self.script: dict[int, Callable[[Sequence[str]], list[Any]]] = {}

    def hold(self, n: int) -> tuple[asyncio.Event, asyncio.Event]:
        self.held[n] = (asyncio.Event(), asyncio.Event())
        return self.held[n]

    async def __call__(self, ops: Sequence[str], now: int | None) -> list[Any]:
        self.calls.append(list(ops))
        n = len(self.calls)
        if n in self.held:
            entered, release = self.held[n]
            entered.set()
            await asyncio.wait_for(release.wait(), BOUND)
        if n in self.script:
            return self.script[n](ops)
        return [f"{op}!" for op in ops]


def tasks_over(
    fake: AsyncFake, max_in_flight: int = 1, timeout: float = BOUND, rows: bool = False
) -> AsyncCoalescer[str, Any]:
    core = ObservedCoalescer(max_in_flight, 256, row_of if rows else None, one_call_per_row=rows)
    return AsyncCoalescer(core, fake, down, timeout, "the fake store", "this driver belongs to another event loop")


def test_async_calls_of_one_tick_go_together_and_later_ones_wait_for_a_slot() -> None:
    async def main() -> None:
        fake = AsyncFake()
        entered, release = fake.hold(1)
        driver = tasks_over(fake)
        first = [asyncio.ensure_future(driver.submit(f"k.{i}", None)) for i in range(3)]
        await asyncio.wait_for(entered.wait(), BOUND)
        later = [asyncio.ensure_future(driver.submit(f"k.{i}", None)) for i in range(3, 5)]
        await observed(driver).queued(2)  # behind the call in flight
        release.set()
        done = await asyncio.wait_for(asyncio.gather(*first, *later), BOUND)
        assert [f"k.{i}!" for i in range(5)] == done
        assert [["k.0", "k.1", "k.2"], ["k.3", "k.4"]] == fake.calls
        await driver.drain()

    asyncio.run(main())


def test_async_a_caller_cancelled_before_its_op_is_sent_charges_nothing() -> None:
    async def main() -> None:
        fake = AsyncFake()
        entered, release = fake.hold(1)
        driver = tasks_over(fake)
        first = asyncio.ensure_future(driver.submit("k.0", None))
        await asyncio.wait_for(entered.wait(), BOUND)
        queued_ = [asyncio.ensure_future(driver.submit(f"k.{i}", None)) for i in range(1, 4)]
        await observed(driver).queued(3)
        queued_[1].cancel()
        await finished(queued_[1])
        release.set()
        done = await asyncio.wait_for(asyncio.gather(first, queued_[0], queued_[2]), BOUND)
        assert ["k.0!", "k.1!", "k.3!"] == done
        assert [["k.0"], ["k.1", "k.3"]] == fake.calls
        assert 0 == driver.core.in_flight

    asyncio.run(main())


def test_async_a_caller_cancelled_after_its_op_is_sent_leaves_the_call_to_the_others() -> None:
    async def main() -> None:
        fake = AsyncFake()
        entered, release = fake.hold(1)
        driver = tasks_over(fake)
        callers = [asyncio.ensure_future(driver.submit(f"k.{i}", None)) for i in range(3)]
        await asyncio.wait_for(entered.wait(), BOUND)
        callers[0].cancel()
        await finished(callers[0])
        release.set()
        assert ["k.1!", "k.2!"] == await asyncio.wait_for(asyncio.gather(*callers[1:]), BOUND)
        assert [["k.0", "k.1", "k.2"]] == fake.calls  # k.0 was sent
        assert 0 == driver.core.in_flight

    asyncio.run(main())


def test_async_a_cancelled_call_reaches_its_callers_as_a_store_error_not_a_cancellation() -> None:
    async def main() -> None:
        fake = AsyncFake()
        entered, _ = fake.hold(1)
        driver = tasks_over(fake)
        callers = [asyncio.ensure_future(driver.submit(f"k.{i}", None)) for i in range(2)]
        await asyncio.wait_for(entered.wait(), BOUND)
        (task,) = driver.tasks
        task.cancel()
        results = await asyncio.wait_for(asyncio.gather(*callers, return_exceptions=True), BOUND)
        assert [StoreError, StoreError] == [type(r) for r in results]
        assert all(isinstance(r.__cause__, asyncio.CancelledError) for r in results)
        assert 0 == driver.core.in_flight
        assert "k.2!" == await driver.submit("k.2", None)

    asyncio.run(main())


def test_async_a_call_cancelled_before_it_ran_frees_its_slot_and_tells_its_callers() -> None:
    async def main() -> None:
        fake = AsyncFake()
        driver = tasks_over(fake)
        callers = [asyncio.ensure_future(driver.submit(f"k.{i}", None)) for i in range(2)]
        # the callers queue their ops, the flush takes them and starts the call's task
        await observed(driver).until(lambda: observed(driver).taken == 1, "the flush")
        (task,) = driver.tasks
        assert [] == fake.calls  # not run yet
        task.cancel()
        results = await asyncio.wait_for(asyncio.gather(*callers, return_exceptions=True), BOUND)
        assert [StoreError, StoreError] == [type(r) for r in results]
        assert (0, set()) == (driver.core.in_flight, driver.tasks)
        assert "k.2!" == await asyncio.wait_for(driver.submit("k.2", None), BOUND)
        assert [["k.2"]] == fake.calls

    asyncio.run(main())


def test_async_an_op_made_after_a_call_failed_is_not_taken_for_one_queued_behind_it() -> None:
    """The store was down for one call; its caller, answered, calls again at once: that op
    was not queued behind the failed call, so it gets a call of its own."""

    async def main() -> None:
        fake = AsyncFake()
        fake.script[1] = lambda ops: (_ for _ in ()).throw(Down("the store is unreachable"))
        driver = tasks_over(fake)
        with pytest.raises(Down):
            await asyncio.wait_for(driver.submit("k.0", None), BOUND)
        assert "k.1!" == await asyncio.wait_for(driver.submit("k.1", None), BOUND)
        assert [["k.0"], ["k.1"]] == fake.calls

    asyncio.run(main())


def test_async_a_queued_caller_times_out_and_its_op_is_never_sent() -> None:
    """The caller queued behind a call that hangs gets StoreTimeout, its op withdrawn; the
    caller of the hanging call too (every asyncio op waits for its tick's flush, so every
    caller has the deadline), its answer dropped."""

    async def main() -> None:
        fake = AsyncFake()
        entered, release = fake.hold(1)
        driver = tasks_over(fake, timeout=0.2)
        started = time.monotonic()
        first = asyncio.ensure_future(driver.submit("k.0", None))
        await asyncio.wait_for(entered.wait(), BOUND)
        with pytest.raises(StoreTimeout):
            await asyncio.wait_for(driver.submit("k.1", None), BOUND)
        with pytest.raises(StoreTimeout):
            await asyncio.wait_for(first, BOUND)
        assert time.monotonic() - started < 0.2 + MARGIN
        release.set()
        assert "k.2!" == await asyncio.wait_for(driver.submit("k.2", None), BOUND)
        assert [["k.0"], ["k.2"]] == fake.calls  # k.0 was sent (its answer dropped); k.1 was not
        assert 0 == driver.core.in_flight

    asyncio.run(main())


def test_async_deadlines_of_answered_callers_are_forgotten_and_one_timer_serves_them_all() -> None:
    async def main() -> None:
        fake = AsyncFake()
        driver = tasks_over(fake, max_in_flight=2)
        for _ in range(3):
            await asyncio.gather(*(driver.submit(f"k.{i}", None) for i in range(50)))
            assert not driver._deadlines  # every caller answered: no deadline kept
        assert driver._timer is not None  # one timer, at the oldest deadline it saw
        assert 3 * 50 == sum(len(call) for call in fake.calls)

    asyncio.run(main())


def test_async_with_one_call_per_row_a_busy_rows_op_waits_while_another_rows_op_goes() -> None:
    """A slot is free but the op's row is busy: it stays queued (and times out while the
    row's call hangs), and an op of another row goes past it in a call of its own."""

    async def main() -> None:
        fake = AsyncFake()
        entered, release = fake.hold(1)
        driver = tasks_over(fake, max_in_flight=2, timeout=0.5, rows=True)
        first = asyncio.ensure_future(driver.submit("a.0", None))
        await asyncio.wait_for(entered.wait(), BOUND)
        same = asyncio.ensure_future(driver.submit("a.1", None))
        assert "b.0!" == await asyncio.wait_for(driver.submit("b.0", None), BOUND)
        assert 1 == len(driver.core.queue)  # a.1, behind its row's call
        with pytest.raises(StoreTimeout):
            await asyncio.wait_for(same, BOUND)
        release.set()
        with pytest.raises(StoreTimeout):
            await asyncio.wait_for(first, BOUND)
        assert [["a.0"], ["b.0"]] == fake.calls

    asyncio.run(main())


def test_async_errors_reach_only_the_calls_they_concern() -> None:
    async def main() -> None:
        fake = AsyncFake()
        fake.script[1] = lambda ops: [f"{ops[0]}!", StoreError("slot failed")]
        driver = tasks_over(fake)
        results = await asyncio.gather(driver.submit("a.0", None), driver.submit("b.0", None), return_exceptions=True)
        assert ["a.0!", "slot failed"] == [str(r) for r in results]

        entered, release = fake.hold(2)
        failure = Down("the store is unreachable")
        fake.script[2] = lambda ops: (_ for _ in ()).throw(failure)
        first = asyncio.ensure_future(driver.submit("k.0", None))
        await asyncio.wait_for(entered.wait(), BOUND)
        behind = [asyncio.ensure_future(driver.submit(f"k.{i}", None)) for i in range(1, 3)]
        await observed(driver).queued(2)
        release.set()
        results = await asyncio.wait_for(asyncio.gather(first, *behind, return_exceptions=True), BOUND)
        assert [failure] * 3 == results
        assert 2 == len(fake.calls)  # those behind got no call of their own

    asyncio.run(main())


def test_async_drain_answers_every_queued_op() -> None:
    async def main() -> None:
        fake = AsyncFake()
        driver = tasks_over(fake)
        driver.core.max_batch = 2
        callers = [asyncio.ensure_future(driver.submit(f"k.{i}", None)) for i in range(7)]
        await observed(driver).until(lambda: observed(driver).pushed == 7, "7 ops queued")
        await asyncio.wait_for(driver.drain(), BOUND)
        assert all(c.done() for c in callers)
        assert [["k.0", "k.1"], ["k.2", "k.3"], ["k.4", "k.5"], ["k.6"]] == fake.calls

    asyncio.run(main())


def test_async_a_driver_used_on_a_second_event_loop_says_so() -> None:
    fake = AsyncFake()
    driver = tasks_over(fake)
    assert "k.0!" == asyncio.run(driver.submit("k.0", None))
    with pytest.raises(RuntimeError, match="another event loop"):
        asyncio.run(driver.submit("k.1", None))


def test_a_driver_does_not_keep_the_store_whose_method_it_runs_alive() -> None:
    """A store owns its driver; the driver holds the store's ``run`` method weakly, so a
    dropped store is freed at once (no cycle left for the garbage collector)."""

    class Store:
        def __init__(self) -> None:
            core: Coalescer[str, Any] = Coalescer(1, 256)
            self.threads = ThreadCoalescer(core, self.run, down, BOUND, "the fake store")
            self.tasks = AsyncCoalescer(Coalescer(1, 256), self.run_async, down, BOUND, "the fake store", "")

        def run(self, ops: Sequence[str], now: int | None) -> list[str]:
            return [f"{op}!" for op in ops]

        async def run_async(self, ops: Sequence[str], now: int | None) -> list[str]:
            return [f"{op}!" for op in ops]

    store = Store()
    assert "k!" == store.threads.submit("k", None)
    assert "k!" == asyncio.run(store.tasks.submit("k", None))
    gone = weakref.ref(store)
    del store
    assert gone() is None


def test_spread_calls_take_an_even_share_of_the_ops_queued_and_in_flight() -> None:
    """With ``spread`` a call takes at most (queued + in flight) / max_in_flight ops, so two
    slots carry calls of even sizes; without it the first call takes every queued op."""
    spread: Coalescer[int, str] = Coalescer(2, 256, spread=True)
    for i in range(50):
        spread.push(i, None, f"w{i}")
    first, second = spread.take(), spread.take()
    assert first is not None and second is not None
    assert (first[0], second[0]) == (list(range(25)), list(range(25, 50)))
    assert spread.take() is None  # no slot free
    spread.finish(first[0])
    for i in range(50, 75):
        spread.push(i, None, f"w{i}")
    third = spread.take()
    assert third is not None and third[0] == list(range(50, 75))

    # calls of uneven sizes even out as they return: 40 and 10 in flight
    uneven: Coalescer[int, str] = Coalescer(2, 256, spread=True)
    for i in range(40):
        uneven.push(i, None, "w")
    big = uneven.take()
    assert big is not None and len(big[0]) == 20  # its share of 40 over two slots
    uneven.push(99, None, "w")
    rest = uneven.take()
    assert rest is not None and len(rest[0]) == 21
    uneven.finish(rest[0])
    for i in range(100, 121):
        uneven.push(i, None, "w")
    again = uneven.take()
    assert again is not None and len(again[0]) == 21  # (21 queued + 20 in flight) / 2, rounded up

    whole: Coalescer[int, str] = Coalescer(2, 256)
    for i in range(50):
        whole.push(i, None, "w")
    taken = whole.take()
    assert taken is not None and len(taken[0]) == 50
