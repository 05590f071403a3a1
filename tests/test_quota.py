"""Dynamic quotas: per-key limits from a provider, cached, refreshed in the background,
never waited for.

Every behaviour is checked with a sync and an async provider, each under ``Limiter``
and ``AsyncLimiter``. Time is a ``FakeClock`` shared by the limiter and the quota;
a provider is held back with a ``threading.Event`` (never by sleeping), and "the
lookups are done" is ``quota.wait_idle()`` / ``await quota.drain()``.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ratekeeper import UNLIMITED, AsyncLimiter, ConfigurationError, Decision, Limit, Limiter, Quota, Rule
from ratekeeper.testing import FakeClock

HOUR = 3600.0


class Provider:
    """A quota provider that answers ``self.answer`` (raising it if it is an exception).

    ``gate`` holds every call until set; ``calls`` lists the keys asked for; ``most``
    is the largest number of calls that were ever running at once.
    """

    def __init__(self, answer: Any = "5/hour") -> None:
        self.answer = answer
        self.gate = threading.Event()
        self.gate.set()
        self.calls: list[str] = []
        self.current = 0
        self.most = 0
        self._lock = threading.Condition()

    def _enter(self, key: str) -> None:
        with self._lock:
            self.calls.append(key)
            self.current += 1
            self.most = max(self.most, self.current)
            self._lock.notify_all()

    def wait_running(self, n: int, timeout: float = 5.0) -> bool:
        """Wait (on a condition, not a clock) until ``n`` calls are inside the provider at once."""
        with self._lock:
            return self._lock.wait_for(lambda: self.current >= n, timeout)

    def _leave(self) -> None:
        with self._lock:
            self.current -= 1

    def _respond(self) -> Any:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def sync(self, key: str) -> Any:
        self._enter(key)
        try:
            assert self.gate.wait(10), "the test never opened the gate"
            return self._respond()
        finally:
            self._leave()

    async def asynchronous(self, key: str) -> Any:
        self._enter(key)
        try:
            if not self.gate.is_set():
                assert await asyncio.to_thread(self.gate.wait, 10), "the test never opened the gate"
            await asyncio.sleep(0)
            return self._respond()
        finally:
            self._leave()


class SyncDriver:
    """Runs requests through a ``Limiter``; ``settle`` waits until no lookup is running."""

    def __init__(self, clock: FakeClock) -> None:
        self.limiter = Limiter(clock=clock)

    def try_acquire(self, rule: Rule, key: str, cost: int = 1) -> Decision:
        return self.limiter.try_acquire(rule, key, cost)

    def settle(self, quota: Quota, timeout: float = 3.0) -> None:
        assert quota.wait_idle(timeout), "the quota lookups did not finish"

    def close(self) -> None:
        self.limiter.close()


class AsyncDriver:
    """Runs requests through an ``AsyncLimiter`` on one event loop; lookups started from
    it run on that loop between requests, and ``settle`` awaits ``quota.drain()``."""

    def __init__(self, clock: FakeClock) -> None:
        self.loop = asyncio.new_event_loop()
        self.limiter = AsyncLimiter(clock=clock)

    def try_acquire(self, rule: Rule, key: str, cost: int = 1) -> Decision:
        return self.loop.run_until_complete(self.limiter.try_acquire(rule, key, cost))

    def settle(self, quota: Quota, timeout: float = 3.0) -> None:
        self.loop.run_until_complete(asyncio.wait_for(quota.drain(), timeout))

    def close(self) -> None:
        self.loop.run_until_complete(self.limiter.aclose())
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()


Driver = SyncDriver | AsyncDriver
COMBINATIONS = [("sync", SyncDriver), ("async", SyncDriver), ("sync", AsyncDriver), ("async", AsyncDriver)]
IDS = ["sync-provider-Limiter", "async-provider-Limiter", "sync-provider-AsyncLimiter", "async-provider-AsyncLimiter"]


def close_quota(quota: Quota) -> None:
    """``quota.close()`` stops its workers and closes its background loop (see the test below)."""
    quota.close()


class Setup:
    def __init__(self, kind: str, driver_class: type[Driver]) -> None:
        self.clock = FakeClock()
        self.provider = Provider()
        self.kind = kind
        self.driver: Driver = driver_class(self.clock)
        self.quotas: list[Quota] = []

    def quota(self, **options: Any) -> Quota:
        fn = self.provider.sync if self.kind == "sync" else self.provider.asynchronous
        quota = Quota(fn, clock=self.clock, **options)
        self.quotas.append(quota)
        return quota

    def try_acquire(self, rule: Rule, key: str = "k") -> Decision:
        return self.driver.try_acquire(rule, key)

    def allowed(self, rule: Rule, n: int, key: str = "k") -> list[bool]:
        return [self.try_acquire(rule, key).allowed for _ in range(n)]

    def settle(self, quota: Quota, timeout: float = 3.0) -> None:
        self.driver.settle(quota, timeout)


@pytest.fixture(params=COMBINATIONS, ids=IDS)
def setup(request: pytest.FixtureRequest) -> Iterator[Setup]:
    kind, driver_class = request.param
    s = Setup(kind, driver_class)
    yield s
    s.provider.gate.set()
    s.driver.close()
    for quota in s.quotas:
        close_quota(quota)


def limit_of(decision: Decision) -> Limit:
    assert 1 == len(decision.limits)
    return decision.limits[0].limit


# --------------------------------------------------------------------------- failsafe, then the provider


def test_until_the_first_answer_the_rules_limits_apply_and_no_request_waits(setup: Setup) -> None:
    quota = setup.quota()
    rule = Rule("api", "2/hour", "fixed_window", quota=quota)
    setup.provider.answer = "5/hour"
    setup.provider.gate.clear()  # the provider hangs until the test lets it answer

    before = [setup.try_acquire(rule) for _ in range(4)]  # decided while the lookup is blocked

    assert [True, True, False, False] == [d.allowed for d in before]
    assert [Limit(2, HOUR)] * 4 == [limit_of(d) for d in before]
    assert None is quota.cached("k")
    setup.provider.gate.set()
    setup.settle(quota)
    assert ["k"] == setup.provider.calls  # one lookup, however many requests came meanwhile
    assert (Limit(5, HOUR),) == quota.cached("k")
    after = [setup.try_acquire(rule) for _ in range(4)]
    assert [Limit(5, HOUR)] * 4 == [limit_of(d) for d in after]
    assert [True, True, True, False] == [d.allowed for d in after]  # 2 + 3 = the provider's 5


def test_each_key_gets_its_own_answer(setup: Setup) -> None:
    quota = setup.quota()
    rule = Rule("api", "1/hour", "gcra", quota=quota)
    setup.try_acquire(rule, "a")
    setup.settle(quota)
    setup.provider.answer = ["3/hour", "2/minute"]
    setup.try_acquire(rule, "b")
    setup.settle(quota)
    assert ((Limit(5, HOUR),), (Limit(3, HOUR), Limit(2, 60))) == (quota.cached("a"), quota.cached("b"))
    assert ["a", "b"] == setup.provider.calls


def test_one_quota_shared_by_two_rules_keeps_their_counters_apart(setup: Setup) -> None:
    """The provider's answer gives the key its limits under each rule's own name and algorithm:
    a request under one rule never charges the other rule's counter."""
    quota = setup.quota()
    setup.provider.answer = "2/hour"
    per_user = Rule("per_user", "1/hour", "fixed_window", quota=quota)
    per_user_gcra = Rule("per_user_gcra", "1/hour", "gcra", quota=quota)
    setup.try_acquire(per_user)
    setup.settle(quota)

    other = setup.try_acquire(per_user_gcra)
    assert ("per_user_gcra", True, Limit(2, HOUR)) == (other.rule, other.allowed, limit_of(other))
    assert [True, False] == setup.allowed(per_user, 2)  # per_user used 1 of 2 before: one left


# --------------------------------------------------------------------------- caching and refresh


def test_answers_are_cached_for_ttl_then_refreshed_in_the_background_while_the_stale_answer_serves(
    setup: Setup,
) -> None:
    quota = setup.quota(ttl=60)
    rule = Rule("api", "1/hour", "sliding_window_log", quota=quota)
    setup.try_acquire(rule)
    setup.settle(quota)

    setup.clock.advance(59.999)
    assert [Limit(5, HOUR)] * 3 == [limit_of(setup.try_acquire(rule)) for _ in range(3)]
    setup.settle(quota)
    assert ["k"] == setup.provider.calls  # within ttl: no new lookup

    setup.clock.advance(0.001)  # ttl reached
    setup.provider.answer = "7/hour"
    setup.provider.gate.clear()
    stale = [setup.try_acquire(rule) for _ in range(3)]
    assert 2 == quota.fetches  # one refresh started, not one per request
    assert [Limit(5, HOUR)] * 3 == [limit_of(d) for d in stale]  # the stale answer serves meanwhile
    assert [True, False, False] == [d.allowed for d in stale]  # 1 + 3 + 1 = 5 per hour
    assert Limit(5, HOUR) == stale[1].denied_by

    setup.provider.gate.set()
    setup.settle(quota)
    assert (Limit(7, HOUR),) == quota.cached("k")
    assert Limit(7, HOUR) == limit_of(setup.try_acquire(rule))
    assert ["k", "k"] == setup.provider.calls


def test_a_failing_provider_keeps_the_last_good_answer_and_is_retried_only_after_retry_after_error(
    setup: Setup,
) -> None:
    quota = setup.quota(ttl=60, retry_after_error=5)
    rule = Rule("api", "1/hour", "token_bucket", quota=quota)
    setup.try_acquire(rule)
    setup.settle(quota)

    setup.clock.advance(60)
    setup.provider.answer = RuntimeError("billing is down")
    assert Limit(5, HOUR) == limit_of(setup.try_acquire(rule))
    setup.settle(quota)
    assert (2, 1) == (len(setup.provider.calls), quota.errors)
    assert (Limit(5, HOUR),) == quota.cached("k")
    assert [Limit(5, HOUR)] * 2 == [limit_of(setup.try_acquire(rule)) for _ in range(2)]

    setup.clock.advance(4.999)
    setup.try_acquire(rule)
    setup.settle(quota)
    assert 2 == len(setup.provider.calls)  # not retried before retry_after_error

    setup.clock.advance(0.001)
    setup.provider.answer = "7/hour"
    setup.try_acquire(rule)
    setup.settle(quota)
    assert 3 == len(setup.provider.calls)
    assert (Limit(7, HOUR),) == quota.cached("k")


def test_a_provider_failing_from_the_start_leaves_the_failsafe_and_is_retried_after_retry_after_error(
    setup: Setup,
) -> None:
    quota = setup.quota(retry_after_error=5)
    rule = Rule("api", "2/hour", "fixed_window", quota=quota)
    setup.provider.answer = ConnectionError("no route to billing")
    setup.try_acquire(rule)
    setup.settle(quota)
    assert [True, False] == setup.allowed(rule, 2)  # the failsafe: 2/hour
    setup.settle(quota)
    assert (1, 1, None) == (len(setup.provider.calls), quota.errors, quota.cached("k"))

    setup.clock.advance(5)
    setup.provider.answer = "4/hour"
    setup.try_acquire(rule)
    setup.settle(quota)
    assert (2, (Limit(4, HOUR),)) == (len(setup.provider.calls), quota.cached("k"))


def test_a_provider_failure_is_logged_with_the_key(setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    quota = setup.quota()
    setup.provider.answer = RuntimeError("billing is down")
    with caplog.at_level("WARNING", logger="ratekeeper.quota"):
        setup.try_acquire(Rule("api", "2/hour", quota=quota), "user-9")
        setup.settle(quota)
    assert any("'user-9'" in r.getMessage() and "billing is down" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- exemptions and bad answers


def test_a_provider_answering_none_exempts_the_key(setup: Setup) -> None:
    quota = setup.quota()
    rule = Rule("api", "1/hour", "gcra", quota=quota)
    setup.provider.answer = None
    setup.provider.gate.clear()
    assert [True, False] == setup.allowed(rule, 2)  # the failsafe until the answer
    setup.provider.gate.set()
    setup.settle(quota)
    assert UNLIMITED is quota.cached("k")
    decisions = [setup.try_acquire(rule) for _ in range(100)]
    assert [True] * 100 == [d.allowed for d in decisions]
    assert [True] * 100 == [d.unlimited for d in decisions]
    assert (sys.maxsize, 0.0, None, ()) == (
        decisions[0].remaining,
        decisions[0].retry_after,
        decisions[0].denied_by,
        decisions[0].limits,
    )


@pytest.mark.parametrize(
    "answer",
    ["nonsense", [], ["5/hour", "5 per fortnight"], "0/hour"],
    ids=["nonsense", "empty-list", "one-bad-limit", "zero-count"],
)
def test_an_invalid_answer_is_treated_as_a_failure(setup: Setup, answer: Any) -> None:
    quota = setup.quota(ttl=60, retry_after_error=5)
    rule = Rule("api", "2/hour", "fixed_window", quota=quota)
    setup.try_acquire(rule)
    setup.settle(quota)
    assert (Limit(5, HOUR),) == quota.cached("k")

    setup.clock.advance(60)
    setup.provider.answer = answer
    setup.try_acquire(rule)
    setup.settle(quota)
    assert (1, (Limit(5, HOUR),)) == (quota.errors, quota.cached("k"))  # the last good answer stays
    setup.clock.advance(4)
    setup.try_acquire(rule)
    setup.settle(quota)
    assert 2 == len(setup.provider.calls)  # and the retry waits retry_after_error


@pytest.mark.parametrize("answer", [42, object()], ids=["int", "object"])
def test_an_answer_that_is_not_limits_at_all_is_treated_as_a_failure(setup: Setup, answer: Any) -> None:
    """An answer that is neither None, a limit nor an iterable of limits is a failure like any
    other: counted in ``errors``, the failsafe keeps serving and the lookup does not stay pending."""
    quota = setup.quota(retry_after_error=5)
    rule = Rule("api", "2/hour", "fixed_window", quota=quota)
    setup.provider.answer = answer
    setup.try_acquire(rule)
    setup.settle(quota, timeout=1.0)
    assert (1, None) == (quota.errors, quota.cached("k"))
    setup.clock.advance(5)
    setup.provider.answer = "4/hour"
    setup.try_acquire(rule)
    setup.settle(quota)
    assert (Limit(4, HOUR),) == quota.cached("k")


def test_an_answer_that_does_not_suit_the_rule_leaves_the_rule_on_its_failsafe(setup: Setup) -> None:
    """Suitability depends on the rule (one quota may serve several): an answer this rule's
    algorithm cannot use is kept in the cache, but this rule keeps deciding with its own limits."""
    quota = setup.quota()
    rule = Rule("api", "2/hour", "fixed_window", quota=quota)
    setup.provider.answer = [Limit(5, HOUR, burst=10)]  # burst means nothing to a fixed window
    setup.try_acquire(rule)
    setup.settle(quota)
    assert (0, (Limit(5, HOUR, burst=10),)) == (quota.errors, quota.cached("k"))
    assert Limit(2, HOUR) == limit_of(setup.try_acquire(rule))
    gcra = Rule("api-gcra", "2/hour", "gcra", quota=quota)
    assert Limit(5, HOUR, burst=10) == limit_of(setup.try_acquire(gcra))


# --------------------------------------------------------------------------- bounded under a flood


def test_a_flood_of_unique_keys_keeps_the_cache_within_max_keys_and_lookups_within_max_pending() -> None:
    clock = FakeClock()
    provider = Provider()
    quota = Quota(provider.sync, clock=clock, max_keys=1_000, max_pending=8, workers=16)
    limiter = Limiter(clock=clock)
    rule = Rule("api", "2/hour", "gcra", quota=quota)
    try:
        # The provider hangs: requests keep being decided, at most max_pending lookups start.
        provider.gate.clear()
        for i in range(20_000):
            assert True is limiter.try_acquire(rule, f"user-{i}").allowed
        assert 8 == quota.fetches
        assert 20_000 - 8 == quota.skipped
        assert provider.wait_running(8)
        provider.gate.set()
        assert quota.wait_idle(5)
        assert 8 == provider.most

        # The provider answers at once: the cache stays within max_keys all along.
        sizes = []
        for i in range(20_000, 100_000):
            limiter.try_acquire(rule, f"user-{i}")
            if i % 20_000 == 0:
                assert quota.wait_idle(5)  # nothing changes the cache while it is counted
                sizes.append(sum(quota.cached(f"user-{j}") is not None for j in range(i + 1)))
        assert quota.wait_idle(5)
        sizes.append(sum(quota.cached(f"user-{j}") is not None for j in range(100_000)))
        assert max(sizes) <= 1_000
        assert min(1_000, quota.fetches) == sizes[-1]  # the newest answers are kept, up to max_keys
        assert provider.most <= 8
        assert quota.fetches == len(provider.calls)  # every lookup started reached the provider
    finally:
        provider.gate.set()
        limiter.close()
        close_quota(quota)


def test_a_flood_of_unique_keys_through_async_lookups_stays_within_max_pending_and_max_keys() -> None:
    clock = FakeClock()
    provider = Provider()
    quota = Quota(provider.asynchronous, clock=clock, max_keys=1_000, max_pending=8)
    limiter = AsyncLimiter(clock=clock)
    rule = Rule("api", "2/hour", "gcra", quota=quota)

    async def flood() -> list[int]:
        sizes = []
        for i in range(100_000):
            await limiter.try_acquire(rule, f"user-{i}")
            if i % 100 == 0:
                await asyncio.sleep(0)  # let the lookups run
            if i % 25_000 == 0:
                sizes.append(sum(quota.cached(f"user-{j}") is not None for j in range(i + 1)))
        await asyncio.wait_for(quota.drain(), 5)
        sizes.append(sum(quota.cached(f"user-{j}") is not None for j in range(100_000)))
        return sizes

    try:
        sizes = asyncio.run(flood())
    finally:
        close_quota(quota)
    assert max(sizes) <= 1_000
    assert min(1_000, quota.fetches) == sizes[-1]
    assert 1 <= provider.most <= 8
    assert quota.skipped > 0


# --------------------------------------------------------------------------- configuration and shutdown


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"ttl": 0}, "Quota ttl must be a positive number of seconds"),
        ({"retry_after_error": -1}, "Quota retry_after_error must be a positive number"),
        ({"max_keys": 0}, "Quota max_keys must be a positive integer"),
        ({"max_pending": 2.5}, "Quota max_pending must be a positive integer"),
        ({"workers": 0}, "Quota workers must be a positive integer"),
    ],
)
def test_bad_quota_options_are_configuration_errors(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        Quota(Provider().sync, **options)
    assert fragment in str(excinfo.value)


def test_a_provider_that_is_not_callable_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        Quota({"user-1": "5/hour"})  # type: ignore[arg-type]
    assert "a quota provider must be callable" in str(excinfo.value)


def test_closing_a_quota_leaves_no_unclosed_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """An async provider used from sync code runs on the quota's own loop; ``close()`` must close
    that loop, not only stop it, or it is reported as an unclosed event loop when collected."""
    unraisable: list[str] = []

    def record(args: Any) -> None:
        unraisable.append(f"{args.exc_type.__name__}: {args.exc_value}")

    clock = FakeClock()
    provider = Provider()
    quota = Quota(provider.asynchronous, clock=clock)
    Limiter(clock=clock).try_acquire(Rule("api", "2/hour", quota=quota), "k")
    assert quota.wait_idle(3)
    quota.close()
    for thread in threading.enumerate():
        if thread.name == "ratekeeper-quota-loop":
            thread.join(5)
    monkeypatch.setattr(sys, "unraisablehook", record)
    del quota
    gc.collect()
    assert [] == [u for u in unraisable if "unclosed" in u]


def _quota_limiter(answer: str) -> tuple[FakeClock, Quota, Limiter]:
    clock = FakeClock()
    quota = Quota(lambda key: [answer], ttl=3600, clock=clock)
    return clock, quota, Limiter(clock=clock)


def test_gcra_quota_with_other_scale_does_not_lock_key_out() -> None:
    """A quota answer that changes a GCRA key's scale (failsafe 3/s, then 10/s: other units
    of the stored time) starts the key afresh instead of reading the old state in the new
    units, which would lock the key out for about twice the clock's value."""
    clock, quota, limiter = _quota_limiter("10/s")
    rule = Rule("api", ["3/s"], algorithm="gcra", quota=quota)
    try:
        assert limiter.try_acquire(rule, "k")  # failsafe 3/s; starts the lookup
        assert quota.wait_idle()
        clock.advance(5)  # idle far longer than either period
        d = limiter.try_acquire(rule, "k")
        assert d.allowed, d
    finally:
        quota.close()


def test_fixed_window_quota_with_other_period_rolls_its_window() -> None:
    """A quota answer that changes a fixed window's period (10/s, then 100/minute) counts in
    the new period's windows: the window resets within a minute and a new minute admits
    again (the old window number must not read as "the clock stepped back")."""
    clock, quota, limiter = _quota_limiter("100/minute")
    rule = Rule("api", ["10/s"], algorithm="fixed_window", quota=quota)
    try:
        assert limiter.try_acquire(rule, "k")
        assert quota.wait_idle()
        d = limiter.try_acquire(rule, "k", 99)
        assert d.allowed
        assert d.reset_after <= 60, d
        clock.advance(61)
        assert limiter.try_acquire(rule, "k"), "a new minute must admit again"
    finally:
        quota.close()


def test_quota_lookup_cancelled_with_its_loop_is_not_pending_forever() -> None:
    """An async provider's lookup cancelled with its event loop (asyncio.run() ends) frees
    its pending slot: the key is looked up again later and wait_idle() succeeds."""
    clock = FakeClock()

    async def slow_provider(key: str) -> list[str]:
        await asyncio.sleep(3600)
        return ["1/s"]

    quota = Quota(slow_provider, clock=clock)
    rule = Rule("api", ["5/s"], quota=quota)

    async def once() -> None:
        async with AsyncLimiter(clock=clock) as limiter:
            await limiter.try_acquire(rule, "k")

    asyncio.run(once())  # the lookup task is cancelled when the loop shuts down
    assert quota.wait_idle(timeout=0.5), f"lookup still pending: {quota._pending}"


def test_a_quota_dropped_without_close_stops_its_background_loop() -> None:
    """A rules file reloaded replaces its quotas without closing them: a dropped quota whose
    async provider ran on its own loop stops that loop's thread when collected (else every
    reload would leave one more thread running)."""
    clock = FakeClock()
    provider = Provider()
    quota = Quota(provider.asynchronous, clock=clock)
    Limiter(clock=clock).try_acquire(Rule("api", "2/hour", quota=quota), "k")
    assert quota.wait_idle(3)
    thread = quota._loop_thread
    assert thread is not None and thread.is_alive()
    del quota
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_reloading_a_rules_file_with_async_quotas_leaves_no_thread_behind(tmp_path: Any) -> None:
    from ratekeeper.config.model import RuleSet
    from ratekeeper.config.watcher import RulesWatcher

    (tmp_path / "quota_provider_for_reload.py").write_text("async def lookup(key):\n    return ['5/s']\n")
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n  - name: api\n    key: '{client_ip}'\n    limits: ['10/s']\n"
        "    quota: quota_provider_for_reload:lookup\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        watcher = RulesWatcher(rules)
        limiter = Limiter()
        before = {t for t in threading.enumerate() if t.name == "ratekeeper-quota-loop"}
        for i in range(5):
            current = watcher.current
            assert isinstance(current, RuleSet)
            rule = current.rules[0].rule
            limiter.try_acquire(rule, f"k{i}")
            assert rule.quota is not None and rule.quota.wait_idle(3)
            del current, rule
            assert watcher.reload()
        gc.collect()
        loops = {t for t in threading.enumerate() if t.name == "ratekeeper-quota-loop"} - before
        for thread in loops:
            thread.join(5)
        assert [t for t in loops if t.is_alive()] == []
    finally:
        sys.path.remove(str(tmp_path))
