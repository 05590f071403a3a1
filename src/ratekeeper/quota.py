"""Dynamic quotas: each key's limits come from a provider (a billing system, a database).

The provider is a sync or async callable ``key -> limits``; it answers a list of limit
strings or ``Limit`` objects, or ``None`` for a key that is not limited at all (an admin
key). A request never waits for it:

- until the first answer for a key, the rule's own limits (the failsafe) apply; what
  they admitted counts against the answer's limits, and each later answer's (a key's
  state is carried across a change of limits: docs/choices.md, "When a limit changes");
- answers are cached for ``ttl`` seconds; a stale answer keeps serving while one
  background refresh runs;
- when the provider fails (raises or answers nonsense) the last good answer stays, and
  the next try waits ``retry_after_error`` seconds (a provider should bound its own
  calls with a timeout: a hung call holds one of ``max_pending`` slots);
- the cache holds at most ``max_keys`` keys (least recently used dropped first) and at
  most ``max_pending`` lookups run at once, so a flood of unknown ids costs bounded
  memory and bounded load on the provider.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ratekeeper.clock import Clock, SystemClock
from ratekeeper.errors import ConfigurationError, RateKeeperError
from ratekeeper.limit import Limit

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.rule import Rule

__all__ = ["UNLIMITED", "Quota", "QuotaAnswer", "QuotaProvider"]

log = logging.getLogger("ratekeeper.quota")

QuotaAnswer = Iterable[str | Limit] | str | Limit | None
QuotaProvider = Callable[[str], QuotaAnswer | Awaitable[QuotaAnswer]]


class _Unlimited:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNLIMITED"


UNLIMITED: Any = _Unlimited()
"""What ``Quota.limits_for`` returns for a key the provider exempts (it answered None)."""


class _Entry:
    """One key's answer: its limits (``UNLIMITED``; None before a first good answer) and,
    per rule using this quota, the plan built from them."""

    __slots__ = ("expires", "limits", "plans", "retry_at")

    def __init__(self, limits: Any, expires: float) -> None:
        self.limits = limits
        self.expires = expires
        self.retry_at = 0.0
        self.plans: dict[Rule, Plan] = {}


class Quota:
    """Per-key limits from ``provider``, cached, refreshed in the background.

    Give it to a rule: ``Rule("api", ["100/minute"], quota=Quota(billing_lookup))``; the
    rule's limits are the failsafe.
    """

    def __init__(
        self,
        provider: QuotaProvider,
        *,
        ttl: float = 60.0,
        retry_after_error: float = 5.0,
        max_keys: int = 100_000,
        max_pending: int = 64,
        workers: int = 4,
        clock: Clock | None = None,
    ) -> None:
        if not callable(provider):
            raise ConfigurationError(f"a quota provider must be callable (key -> limits), got {provider!r}")
        for name, value in (("ttl", ttl), ("retry_after_error", retry_after_error)):
            if not isinstance(value, int | float) or value <= 0:
                raise ConfigurationError(f"Quota {name} must be a positive number of seconds, got {value!r}")
        for name, value in (("max_keys", max_keys), ("max_pending", max_pending), ("workers", workers)):
            if type(value) is not int or value < 1:
                raise ConfigurationError(f"Quota {name} must be a positive integer, got {value!r}")
        self.provider = provider
        self.ttl = float(ttl)
        self.retry_after_error = float(retry_after_error)
        self.max_keys = max_keys
        self.max_pending = max_pending
        self._is_async = inspect.iscoroutinefunction(provider) or inspect.iscoroutinefunction(type(provider).__call__)
        self._clock = clock or SystemClock()
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._pending: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._workers = workers
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._stop_loop: Callable[[], Any] | None = None
        self.errors = 0
        self.fetches = 0
        self.skipped = 0

    # -- what the limiter asks ----------------------------------------------------------

    def plan_for(self, key: str, rule: Rule) -> Plan | Any:
        """The plan for ``key`` now (its limits under the rule's algorithm), or ``UNLIMITED``.

        Never blocks: the rule's own plan (the failsafe) answers until the provider does.
        One quota may serve several rules; each gets a plan of its own from the answer.
        """
        now = self._clock.now_us() / 1_000_000
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                if key not in self._pending:
                    self._start(key)
                return rule.plan
            self._cache.move_to_end(key)
            if now >= entry.expires and now >= entry.retry_at and key not in self._pending:
                self._start(key)
            limits = entry.limits
            if limits is None:
                return rule.plan
            if limits is UNLIMITED:
                return UNLIMITED
            plan = entry.plans.get(rule)
            if plan is None:
                plan = entry.plans[rule] = self._plan(rule, key, limits)
            return plan

    @staticmethod
    def _plan(rule: Rule, key: str, limits: tuple[Limit, ...]) -> Plan:
        try:
            return rule.plan_for(tuple(Limit.parse(limit, rule.burst) for limit in limits))
        except RateKeeperError as exc:
            log.warning("quota for key %r does not suit rule %r (%s); its own limits apply", key, rule.name, exc)
            return rule.plan

    def cached(self, key: str) -> tuple[Limit, ...] | Any | None:
        """The cached limits for ``key`` (``UNLIMITED``; None when none); for tests and tools."""
        with self._lock:
            entry = self._cache.get(key)
            return None if entry is None else entry.limits

    # -- fetching -----------------------------------------------------------------------

    def _start(self, key: str) -> None:
        # Called with the lock held.
        if len(self._pending) >= self.max_pending:
            self.skipped += 1
            return
        self.fetches += 1
        self._pending[key] = True
        if self._is_async:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = self._background_loop()
                cf = asyncio.run_coroutine_threadsafe(self._fetch_async(key), loop)
                self._pending[key] = cf
                return
            self._pending[key] = loop.create_task(self._fetch_async(key))
        else:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="ratekeeper-quota")
            future: Future[None] = self._executor.submit(self._fetch_sync, key)
            self._pending[key] = future

    def _background_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=_run_loop, args=(loop,), name="ratekeeper-quota-loop", daemon=True)
            thread.start()
            self._loop, self._loop_thread = loop, thread
            # A quota dropped without close() (its rules replaced by a reload of the rules
            # file) stops its loop when it is collected; else every reload would leave a
            # thread running for good. Nothing the loop runs holds the quota once idle.
            self._stop_loop = weakref.finalize(self, _stop_loop, loop, thread)
        return self._loop

    def _fetch_sync(self, key: str) -> None:
        try:
            answer = self.provider(key)
            if inspect.isawaitable(answer):
                answer = asyncio.run(_await(answer))
            limits = _parse_answer(answer)
        except Exception as exc:  # noqa: BLE001 - any provider failure keeps the last answer
            self._failed(key, exc)
        else:
            self._answered(key, limits)

    async def _fetch_async(self, key: str) -> None:
        try:
            answer = self.provider(key)
            if inspect.isawaitable(answer):
                answer = await answer
            limits = _parse_answer(answer)
        except Exception as exc:  # noqa: BLE001 - any provider failure keeps the last answer
            self._failed(key, exc)
        except BaseException:
            # Cancelled (its loop shut down): not pending any more, asked again next time.
            with self._lock:
                self._pending.pop(key, None)
                self._idle.notify_all()
            raise
        else:
            self._answered(key, limits)

    def _answered(self, key: str, limits: Any) -> None:
        now = self._clock.now_us() / 1_000_000
        with self._lock:
            self._pending.pop(key, None)
            self._cache[key] = _Entry(limits, now + self.ttl)
            self._cache.move_to_end(key)
            while len(self._cache) > self.max_keys:
                self._cache.popitem(last=False)
            self._idle.notify_all()

    def _failed(self, key: str, exc: BaseException) -> None:
        log.warning("quota provider failed for key %r: %s: %s", key, type(exc).__name__, exc)
        now = self._clock.now_us() / 1_000_000
        with self._lock:
            self.errors += 1
            self._pending.pop(key, None)
            entry = self._cache.get(key)
            if entry is None:
                entry = self._cache[key] = _Entry(None, now)
                while len(self._cache) > self.max_keys:
                    self._cache.popitem(last=False)
            entry.retry_at = now + self.retry_after_error
            self._idle.notify_all()

    # -- for tests and shutdown ---------------------------------------------------------

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Block until no lookup is running (True) or ``timeout`` passes (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout)

    async def drain(self) -> None:
        """Wait (on the event loop) until no lookup started from it is running."""
        while True:
            with self._lock:
                tasks = [t for t in self._pending.values() if isinstance(t, asyncio.Task)]
                others = any(not isinstance(t, asyncio.Task) for t in self._pending.values())
            if not tasks and not others:
                return
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            else:
                await asyncio.sleep(0.001)

    def close(self) -> None:
        """Stop the background workers (pending lookups are abandoned). A limiter does not own
        the quotas of the rules it decides, so closing one does not close them: call this."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        stop = self._stop_loop
        if stop is not None:
            stop()
            self._loop = self._loop_thread = self._stop_loop = None


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """A quota's background loop, closed by its own thread once stopped."""
    try:
        loop.run_forever()
    finally:
        loop.close()


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Stop a quota's background loop and wait for its thread (unless this is that thread:
    a collection may run there; the loop then stops once this callback returns)."""
    if not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)
    if thread is not threading.current_thread():
        thread.join(timeout=5)


async def _await(answer: Awaitable[QuotaAnswer]) -> QuotaAnswer:
    return await answer


def _parse_answer(answer: QuotaAnswer) -> Any:
    """The provider's answer as a tuple of ``Limit`` (or ``UNLIMITED``); raises when it is none."""
    if answer is None:
        return UNLIMITED
    if isinstance(answer, str | Limit):
        return (Limit.parse(answer),)
    if not isinstance(answer, Iterable):
        raise ConfigurationError(f"a quota provider must answer limits or None, got {answer!r}")
    limits = tuple(Limit.parse(item) for item in answer)
    if not limits:
        raise ConfigurationError("a quota provider answered no limits; answer None to exempt a key")
    return limits
