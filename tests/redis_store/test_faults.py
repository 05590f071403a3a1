"""The failure policy against a real redis-server that dies, hangs and comes back.

Each test starts its own ``redis-server`` on a spare port (``redis_server`` fixture), puts
a limiter with a short ``timeout`` under load, and kills it (SIGKILL), pauses it
(SIGSTOP: connections stay open, nothing answers) or restarts it. Pinned: every call
returns within the timeout plus a margin (measured here with ``time.monotonic``: a
correctness bound, not a benchmark), the policy answers, the breaker stops calling the
dead store, and the same limiter uses the store again once it is back.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Any

import pytest

import fault_load
from fault_load import Progress, load, threads_through, timed
from ratekeeper import AsyncLimiter, Decision, Limiter, Rule, StoreError
from ratekeeper.limiter.breaker import CLOSED, OPEN, CircuitBreaker
from ratekeeper.stores.redis.store import RedisStore
from ratekeeper.stores.redis.store_async import AsyncRedisStore
from servers import RedisServer

pytestmark = pytest.mark.redis

TIMEOUT = 0.2
"""The store's timeout (connect and each call)."""
MARGIN = 0.25
"""Scheduling slack on a busy 2-core machine: a call may take TIMEOUT + MARGIN at most."""
COOL_DOWN = 1.0
RECOVERY = 10.0
"""The longest the tests wait for a restarted server to be used again."""

RULE = Rule("api.reads", ["1000/s"], algorithm="gcra")
LOGIN = Rule("auth.login", ["5/minute"], algorithm="fixed_window")


class CountingRedisStore(RedisStore):
    """A ``RedisStore`` that counts the decisions asked of it (those the breaker let through)."""

    calls = 0

    def decide(self, *args: Any, **kwargs: Any) -> Decision:
        self.calls += 1
        return super().decide(*args, **kwargs)


class CountingAsyncRedisStore(AsyncRedisStore):
    calls = 0

    async def decide(self, *args: Any, **kwargs: Any) -> Decision:
        self.calls += 1
        return await super().decide(*args, **kwargs)


def limiter_on(
    server: RedisServer, prefix: str, on_error: str, failures: int = 3
) -> tuple[Limiter, CountingRedisStore]:
    store = CountingRedisStore(server.url, prefix=f"{prefix}:", timeout=TIMEOUT)
    breaker = CircuitBreaker(failures, cool_down=COOL_DOWN)
    return Limiter(store, on_error=on_error, breaker=breaker), store


wait_for_store = partial(fault_load.wait_for_store, recovery=RECOVERY)


def test_killed_server_the_policy_answers_fast_and_the_breaker_stops_calling_it(
    redis_server: RedisServer, key_prefix: str
) -> None:
    limiter, store = limiter_on(redis_server, key_prefix, "local")
    healthy, _ = load(limiter, RULE, 20)
    assert {None} == {d.fallback for d in healthy}

    redis_server.kill()
    calls_before = store.calls
    decisions, slowest = load(limiter, RULE, 200)

    assert slowest <= TIMEOUT + MARGIN, f"a call took {slowest:.3f}s with timeout {TIMEOUT}s"
    assert {"local"} == {d.fallback for d in decisions}
    assert OPEN == limiter.breaker.state
    # Three failures open the breaker; at most one probe per cool-down after that.
    assert store.calls - calls_before <= 3 + 1
    assert 3 <= limiter.failures.count("api.reads", cause="error", outcome="local") <= 4
    assert limiter.failures.count("api.reads", cause="open", outcome="local") >= 196

    redis_server.start()
    assert wait_for_store(limiter, RULE).allowed
    assert CLOSED == limiter.breaker.state
    after, _ = load(limiter, RULE, 20)
    assert {None} == {d.fallback for d in after}
    with redis_server.client() as client:
        assert client.dbsize() > 0  # the decisions after the restart were written to Redis
    limiter.close()


def test_local_policy_keeps_the_rules_limit_while_redis_is_down(redis_server: RedisServer, key_prefix: str) -> None:
    limiter, _ = limiter_on(redis_server, key_prefix, "local")
    redis_server.kill()
    decisions = [limiter.try_acquire(LOGIN, "user-42") for _ in range(8)]
    assert [True] * 5 + [False] * 3 == [bool(d) for d in decisions]
    assert {"local"} == {d.fallback for d in decisions}
    limiter.close()


def test_paused_server_every_call_returns_within_the_timeout_and_is_denied(
    redis_server: RedisServer, key_prefix: str
) -> None:
    """SIGSTOP: the socket stays open and nothing answers, so only the timeout ends a call."""
    limiter, store = limiter_on(redis_server, key_prefix, "deny")
    load(limiter, LOGIN, 3)

    redis_server.pause()
    try:
        calls_before = store.calls
        decisions, slowest = load(limiter, LOGIN, 30)
        assert slowest <= TIMEOUT + MARGIN, f"a call took {slowest:.3f}s with timeout {TIMEOUT}s"
        assert [False] * 30 == [bool(d) for d in decisions]
        assert {"deny"} == {d.fallback for d in decisions}
        assert all(0 < d.retry_after <= COOL_DOWN for d in decisions)
        assert store.calls - calls_before <= 3 + 1
        assert limiter.failures.count(cause="timeout", outcome="deny") >= 3
    finally:
        redis_server.resume()

    assert wait_for_store(limiter, LOGIN).allowed
    limiter.close()


def test_under_raise_the_caller_sees_only_store_errors_and_each_within_the_timeout(
    redis_server: RedisServer, key_prefix: str
) -> None:
    limiter, _ = limiter_on(redis_server, key_prefix, "raise", failures=2)
    redis_server.pause()
    try:
        for _ in range(10):
            start = time.monotonic()
            with pytest.raises(StoreError):
                limiter.try_acquire(RULE, "k")
            elapsed = time.monotonic() - start
            assert elapsed <= TIMEOUT + MARGIN, f"a call took {elapsed:.3f}s with timeout {TIMEOUT}s"
    finally:
        redis_server.resume()
    assert {"timeout", "open"} == {cause for (_, cause, _) in limiter.failures.counts}
    limiter.close()


def test_restart_mid_load_from_threads_no_error_reaches_the_callers_and_the_store_is_used_again(
    redis_server: RedisServer, key_prefix: str
) -> None:
    """Four threads keep deciding while the server stops for half a second and starts
    again on the same port; nothing is recreated.

    Queued callers of the store's coalescing may wait for the call ahead of theirs: the
    bound for a thread is two timeouts plus the margin.
    """
    limiter, _ = limiter_on(redis_server, key_prefix, "allow")

    def disrupt(progress: Progress) -> None:
        progress.wait_for(None, 20, RECOVERY)  # the store decides
        redis_server.stop()
        progress.wait_for("allow", 20, RECOVERY)  # past the client's own reconnect retries: the policy answers
        redis_server.start()
        wait_for_store(limiter, RULE)
        progress.wait_for(None, 20, RECOVERY)  # the store decides again

    errors, slowest, seen = threads_through(limiter, RULE, disrupt, join=RECOVERY)
    assert [] == errors
    assert max(slowest) <= 2 * TIMEOUT + MARGIN, f"a call took {max(slowest):.3f}s"
    assert seen >= {None, "allow"}  # the store, then the policy, then the store
    assert CLOSED == limiter.breaker.state
    limiter.close()


def test_async_limiter_through_kill_pause_and_restart(redis_server: RedisServer, key_prefix: str) -> None:
    async def main() -> None:
        store = CountingAsyncRedisStore(redis_server.url, prefix=f"{key_prefix}:", timeout=TIMEOUT)
        limiter = AsyncLimiter(store, on_error="allow", breaker=CircuitBreaker(3, cool_down=COOL_DOWN))

        async def timed_batch(n: int) -> tuple[list[Decision], float]:
            async def one(i: int) -> tuple[Decision, float]:
                start = time.monotonic()
                decision = await limiter.try_acquire(RULE, f"user-{i % 5}")
                return decision, time.monotonic() - start

            results = await asyncio.gather(*(one(i) for i in range(n)))
            return [d for d, _ in results], max(s for _, s in results)

        healthy, _ = await timed_batch(20)
        assert {None} == {d.fallback for d in healthy}

        redis_server.pause()
        try:
            for _ in range(5):
                decisions, slowest = await timed_batch(20)
                assert slowest <= TIMEOUT + MARGIN, f"a call took {slowest:.3f}s with timeout {TIMEOUT}s"
                assert {"allow"} == {d.fallback for d in decisions}
        finally:
            redis_server.resume()
        assert OPEN == limiter.breaker.state

        redis_server.kill()
        calls_before = store.calls
        decisions, slowest = await timed_batch(50)
        assert slowest <= TIMEOUT + MARGIN
        assert store.calls - calls_before <= 1  # open: at most one probe reaches the store
        redis_server.start()

        deadline = time.monotonic() + RECOVERY
        while (await limiter.try_acquire(RULE, "recovery")).fallback is not None:
            assert time.monotonic() < deadline, "the store was not used again after the restart"
            await asyncio.sleep(0.05)
        after, _ = await timed_batch(20)
        assert {None} == {d.fallback for d in after}
        await limiter.aclose()

    asyncio.run(main())


def test_the_limiters_timeout_reaches_the_store(redis_server: RedisServer, key_prefix: str) -> None:
    """``Limiter(url, timeout=..., on_error=...)``, the way users write it, bounds a hung call."""
    limiter = Limiter(redis_server.url, prefix=f"{key_prefix}:", timeout=TIMEOUT, on_error="deny")
    assert limiter.try_acquire(LOGIN, "u").fallback is None
    redis_server.pause()
    try:
        decision, took = timed(limiter, LOGIN, "u")
    finally:
        redis_server.resume()
    assert took <= TIMEOUT + MARGIN, f"a call took {took:.3f}s with timeout {TIMEOUT}s"
    assert (False, "deny") == (decision.allowed, decision.fallback)
    assert 1 == limiter.failures.count("auth.login", cause="timeout", outcome="deny")
    limiter.close()
