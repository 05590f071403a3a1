"""The Redis store behind Sentinel survives a failover: callers see no exception, decisions
keep coming within a bounded pause, later writes land on the new master, and a limit that
was exhausted (and replicated) before the failover still refuses after it.

Each test starts its own master + replica + three sentinels (``fresh_sentinel_set``, about
a second) and forces ``SENTINEL FAILOVER``; ``SentinelSet.failover()`` returns once every
sentinel names the new master and the old one has been demoted to its replica.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
from dataclasses import dataclass, field

import pytest
import redis

from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.errors import StoreError
from ratekeeper.stores import wire
from servers import SentinelSet

pytestmark = pytest.mark.redis

LOGIN = Rule("login", ["5/3s"], algorithm="sliding_window_log")
KEYS = [f"user-{i}" for i in range(40)]
MAX_PAUSE = 5.0  # seconds: the longest a caller may wait for a decision across the failover
THREADS = 4  # callers at once (threads, or asyncio tasks): some call is always in flight at the switch
DECISIONS_AFTER = 200  # decisions made after the failover before the load stops


@dataclass
class Load:
    """What a load loop saw: when each decision came back, and any exception."""

    stamps: list[float] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def longest_pause(self) -> float:
        return max((b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)), default=0.0)

    def wait_for(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.stamps) < count and not self.errors and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.errors:
            raise AssertionError(f"the limiter raised {self.errors[0]!r} to its caller") from self.errors[0]
        assert len(self.stamps) >= count, f"only {len(self.stamps)} decisions within {timeout}s"


def keys_on(server_port: int, prefix: str) -> set[bytes]:
    """The keys under ``prefix`` on one data node (SCAN: a test's private server)."""
    with redis.Redis(host="127.0.0.1", port=server_port, socket_timeout=2.0) as conn:
        return set(conn.scan_iter(match=f"{prefix}*", count=1000))


def test_threaded_load_sees_no_error_across_a_failover_and_writes_to_the_new_master(
    fresh_sentinel_set: SentinelSet, key_prefix: str
) -> None:
    sentinels = fresh_sentinel_set
    load = Load()
    with Limiter(sentinels.sentinel_url(), prefix=f"{key_prefix}:") as limiter:

        def hammer(offset: int) -> None:
            i = offset
            while not load.stop.is_set():
                try:
                    limiter.try_acquire(LOGIN, KEYS[i % len(KEYS)])
                except BaseException as exc:  # noqa: BLE001 - the test reports whatever escaped
                    load.errors.append(exc)
                    return
                load.stamps.append(time.monotonic())
                i += 1

        workers = [threading.Thread(target=hammer, args=(n,), name=f"hammer-{n}") for n in range(THREADS)]
        for worker in workers:
            worker.start()
        try:
            load.wait_for(50, timeout=10)
            old = sentinels.master_port()
            new = sentinels.failover()
            after = len(load.stamps)
            load.wait_for(after + DECISIONS_AFTER, timeout=15)
        finally:
            load.stop.set()
            for worker in workers:
                worker.join(10)
        assert new != old
        assert load.longest_pause() < MAX_PAUSE

        fresh = "written-after-failover"
        assert limiter.try_acquire(LOGIN, fresh)
        stored = wire.storage_key(f"{key_prefix}:", LOGIN.plan, fresh).encode()
        assert stored in keys_on(new, f"{key_prefix}:")


def test_asyncio_load_sees_no_error_across_a_failover_and_writes_to_the_new_master(
    fresh_sentinel_set: SentinelSet, key_prefix: str
) -> None:
    sentinels = fresh_sentinel_set
    load = Load()

    async def main() -> int:
        async with AsyncLimiter(sentinels.sentinel_url(), prefix=f"{key_prefix}:") as limiter:

            async def hammer(offset: int) -> None:
                i = offset
                while not load.stop.is_set():
                    try:
                        await limiter.try_acquire(LOGIN, KEYS[i % len(KEYS)])
                    except BaseException as exc:  # noqa: BLE001 - the test reports whatever escaped
                        load.errors.append(exc)
                        return
                    load.stamps.append(time.monotonic())
                    i += 1

            tasks = [asyncio.create_task(hammer(n)) for n in range(THREADS)]
            try:
                await asyncio.to_thread(load.wait_for, 50, 10)
                new = await asyncio.to_thread(sentinels.failover)
                after = len(load.stamps)
                await asyncio.to_thread(load.wait_for, after + DECISIONS_AFTER, 15)
            finally:
                load.stop.set()
                await asyncio.wait_for(asyncio.gather(*tasks), 10)
            assert await limiter.try_acquire(LOGIN, "written-after-failover")
            return new

    old = sentinels.master_port()
    with warnings.catch_warnings():
        # Unclosed connections would warn in whichever test runs the garbage collector next;
        # test_closing_an_async_limiter_closes_its_sentinel_connections is the one that pins them.
        warnings.simplefilter("ignore", ResourceWarning)
        new = asyncio.run(main())
        gc.collect()
    assert new != old
    assert not load.errors
    assert load.longest_pause() < MAX_PAUSE
    stored = wire.storage_key(f"{key_prefix}:", LOGIN.plan, "written-after-failover").encode()
    assert stored in keys_on(new, f"{key_prefix}:")


@pytest.mark.parametrize("algorithm", ["sliding_window_log", "token_bucket"])
def test_an_exhausted_key_is_still_refused_after_a_failover(
    fresh_sentinel_set: SentinelSet, key_prefix: str, algorithm: str
) -> None:
    """Replication is asynchronous, so the test waits until the replica holds the exhausted
    state before failing over: otherwise the last writes could be lost with the old master,
    which Redis allows and no client can prevent. ``WAIT`` only waits for the writes of its
    own connection, so the test writes a fence key on that connection first: the replication
    stream is ordered, so once the replica acknowledges the fence it holds every earlier write.
    The window is a minute, far longer than the failover, so the state cannot expire
    meanwhile (its TTL runs on the server's real clock)."""
    sentinels = fresh_sentinel_set
    rule = Rule("login", ["5/minute"], algorithm=algorithm)
    with Limiter(sentinels.sentinel_url(), prefix=f"{key_prefix}:") as limiter:
        admitted = [limiter.try_acquire(rule, "user-7").allowed for _ in range(6)]
        assert admitted == [True] * 5 + [False]
        with sentinels.master().client() as master:
            master.set(f"{key_prefix}:fence", 1, px=60_000)
            assert master.execute_command("WAIT", 1, 5000) == 1
        with sentinels.replica().client() as replica:
            assert replica.exists(wire.storage_key(f"{key_prefix}:", rule.plan, "user-7")) == 1
        sentinels.failover()
        refused = limiter.try_acquire(rule, "user-7")
        assert not refused
        assert refused.retry_after > 0
        assert limiter.try_acquire(rule, "user-8")  # a fresh key is admitted on the new master


def test_closing_an_async_limiter_closes_its_sentinel_connections(sentinel_set: SentinelSet, key_prefix: str) -> None:
    """Nothing is left open for the garbage collector: an unclosed asyncio connection (to a
    sentinel or to the master) would warn, and the warning would fail any caller's test."""

    async def main() -> None:
        async with AsyncLimiter(sentinel_set.sentinel_url(), prefix=f"{key_prefix}:") as limiter:
            assert await limiter.try_acquire(Rule("close", ["5/minute"], algorithm="token_bucket"), "k")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(main())
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []


def test_when_the_master_hangs_the_limiter_follows_the_sentinels_to_the_new_master(
    fresh_sentinel_set: SentinelSet, key_prefix: str
) -> None:
    """The limiter's pooled connection still points at the old master, which hangs
    (SIGSTOP) while the sentinels promote the replica on their own. The call sent on that
    connection may time out (a StoreTimeout: its outcome is unknown, so it is not resent),
    but no more than that one: reconnecting asks the sentinels again, so the next decision
    is made by the new master, all within a few store timeouts."""
    sentinels = fresh_sentinel_set
    rule = Rule("login", ["5/minute"], algorithm="sliding_window_log")
    failures: list[StoreError] = []
    with Limiter(sentinels.sentinel_url(), prefix=f"{key_prefix}:", timeout=0.5) as limiter:
        assert limiter.try_acquire(rule, "user-1")
        old = sentinels.master()
        old.pause()
        try:
            new = sentinels.wait_for_new_master(old.port, timeout=30)
            started = time.monotonic()
            decision = None
            for _ in range(3):
                try:
                    decision = limiter.try_acquire(rule, "user-2")
                    break
                except StoreError as exc:
                    failures.append(exc)
            elapsed = time.monotonic() - started
        finally:
            old.resume()
    assert new != old.port
    assert len(failures) <= 1, failures
    assert decision is not None and decision.allowed
    assert elapsed < 3.0
    assert wire.storage_key(f"{key_prefix}:", rule.plan, "user-2").encode() in keys_on(new, f"{key_prefix}:")
