"""``Limiter``: decide, for a rule, a key and a cost, whether a request may proceed.

Generated from ``async_limiter.py`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from ratekeeper.breaker import CircuitBreaker
from ratekeeper.clock import Clock, SystemClock
from ratekeeper.core import (
    bad_call,
    batch_items,
    batch_result,
    check,
    check_timeout,
    new_lease_id,
    plan_for,
    refund_plan,
    require_leases,
    resolve_items,
)
from ratekeeper.decision import BatchDecision, Decision
from ratekeeper.decorator import limit_decorator
from ratekeeper.errors import StoreError
from ratekeeper.failure import FailurePolicy
from ratekeeper.flows import Decide, Refund, acquire_flow, run_sync
from ratekeeper.lease import Lease
from ratekeeper.rule import MAX_KEY_LENGTH, Rule
from ratekeeper.stores.base import Store
from ratekeeper.stores.url import open_store

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan

__all__ = ["Limiter"]

F = TypeVar("F", bound=Callable[..., Any])


class Limiter:
    """Decides, for a rule, a key and a cost, whether a request may proceed.

    ``Limiter("memory://")`` (the default) keeps state in this process; any store
    object is accepted too. ``clock`` replaces the monotonic clock of the memory store and
    of every wait (``ratekeeper.testing.FakeClock`` in tests). Use it as a context manager
    to close the store on exit.

    When the store fails (``StoreError``; ``StoreTimeout`` after ``timeout`` seconds, the
    store's default when None), ``on_error`` answers: ``"raise"``, ``"allow"``, ``"deny"``
    or ``"local"`` (a rule's own ``on_error`` wins; see ``ratekeeper.failure``). The
    ``breaker`` (a ``CircuitBreaker``; default: open after 5 consecutive failures for 1 s;
    False: never open) stops calling a failing store, so each call then costs
    microseconds. ``failures`` counts what the policy did, per rule.
    """

    def __init__(
        self,
        store: str | Store = "memory://",
        *,
        clock: Clock | None = None,
        on_error: str = "raise",
        timeout: float | None = None,
        breaker: CircuitBreaker | bool = True,
        **options: Any,
    ) -> None:
        if clock is not None:
            options["clock"] = clock
        if timeout is not None and not (isinstance(store, str) and urlsplit(store).scheme.lower() == "memory"):
            options["timeout"] = timeout  # the memory store never waits: nothing to bound
        self.store: Store = open_store(store, **options)
        self.clock: Clock = getattr(self.store, "clock", None) or clock or SystemClock()
        if not isinstance(breaker, CircuitBreaker):
            breaker = CircuitBreaker(clock=self.clock) if breaker else CircuitBreaker(None, clock=self.clock)
        elif breaker.clock is None:
            breaker.clock = self.clock
        self.breaker = breaker
        self.failure_policy = FailurePolicy(on_error, breaker, self.clock, type(self.store).__name__)
        self.failures = self.failure_policy.stats
        self._store_decide = self.store.decide
        breaker.set_guard(self._route)

    @property
    def on_error(self) -> str:
        """The failure policy of rules without their own ``on_error``."""
        return self.failure_policy.on_error

    def try_acquire(self, rule: Rule, key: str, cost: int = 1, *, now: int | None = None) -> Decision:
        """Charge ``cost`` to ``key`` under ``rule`` if every limit admits it; never waits.

        ``now`` (µs on the store's clock) is for tests and the conformance suite.
        """
        # ``core.check`` written inline (the rule is checked by its attribute): the hot path.
        if type(key) is not str or not key or len(key) > MAX_KEY_LENGTH or type(cost) is not int or cost < 0:
            raise bad_call(rule, key, cost)
        try:
            quota = rule.quota
        except AttributeError:
            raise bad_call(rule, key, cost) from None
        plan = rule._plan if quota is None else plan_for(rule, key)
        if plan is None:
            return Decision.unlimited_for(rule.name)
        lease = new_lease_id() if plan.leases else None
        try:
            return self._store_decide(plan, key, cost, None, lease, now)
        except StoreError as exc:
            return self.failure_policy.decide(rule, plan, key, cost, None, lease, now, True, exc)

    def peek(self, rule: Rule, key: str, cost: int = 1, *, now: int | None = None) -> Decision:
        """What ``try_acquire`` would answer, without charging anything."""
        check(rule, key, cost)
        plan = plan_for(rule, key)
        if plan is None:
            return Decision.unlimited_for(rule.name)
        try:
            return self._guarded_decide(plan, key, cost, None, None, now, False)
        except StoreError as exc:
            return self.failure_policy.decide(rule, plan, key, cost, None, None, now, False, exc)

    def acquire(self, rule: Rule, key: str, cost: int = 1, *, timeout: float | None = None) -> Decision:
        """Wait until ``cost`` is admitted, at most ``timeout`` seconds; else raise ``RateLimitExceeded``.

        Token bucket, GCRA and leaky bucket reserve the next free slot in one call and
        sleep until it: first come, first served across every process sharing the store.
        Interrupted or cancelled while sleeping, it gives the reservation back. The decision
        returned tells the ``delay`` it waited.
        """
        check(rule, key, cost)
        timeout = check_timeout(timeout)
        plan = plan_for(rule, key)
        if plan is None:
            return Decision.unlimited_for(rule.name)
        lease = new_lease_id() if plan.leases else None
        flow = acquire_flow(plan, key, cost, timeout, self.clock, lease)
        return run_sync(flow, partial(self._decide, rule), partial(self._refund, rule), self.clock)

    def try_acquire_many(self, items: Iterable[tuple[Any, ...]]) -> BatchDecision:
        """Charge several (rule, key[, cost]) at once: all of them, or none."""
        resolved = resolve_items(items)
        items_ = batch_items(resolved)
        if not items_:
            return batch_result(resolved, ())
        try:
            self.breaker.check()
            answers = self.store.decide_many(items_)
        except StoreError as exc:
            answers = self.failure_policy.decide_many(resolved, exc)
        else:
            self.breaker.record_success()
        return batch_result(resolved, answers)

    def refund(self, rule: Rule, key: str, cost: int = 1, *, lease_id: str | None = None) -> None:
        """Give back ``cost`` charged earlier (the actual cost was lower than estimated)."""
        plan = refund_plan(rule, key, cost, lease_id)
        if plan is not None:
            self._refund(rule, Refund(plan, key, cost, lease_id))

    def release(self, rule: Rule, key: str, lease_id: str) -> None:
        """Release a concurrency lease before it expires."""
        require_leases(rule)
        self.refund(rule, key, 0, lease_id=lease_id)

    def reset(self, rule: Rule, key: str) -> None:
        """Forget everything charged to ``key`` under ``rule``."""
        check(rule, key, 0)
        plan = plan_for(rule, key)
        if plan is None:
            return
        try:
            self.breaker.check()
            self.store.reset(plan, key)
        except StoreError as exc:
            self.failure_policy.reset(rule, plan, key, exc)
        else:
            self.breaker.record_success()

    def lease(self, rule: Rule, key: str, cost: int = 1, *, timeout: float | None = 0) -> Lease:
        """A context manager holding a concurrency lease for its block.

        Waits up to ``timeout`` seconds for a free slot (0: do not wait), else raises
        ``RateLimitExceeded``; the lease is released on exit.
        """
        require_leases(rule)
        return Lease(self, rule, key, cost, timeout)

    def limit(
        self,
        rule: Rule,
        key: str | Callable[..., str] = "*",
        *,
        cost: int | Callable[..., int] = 1,
        wait: float | None = None,
    ) -> Callable[[F], F]:
        """Decorate a function so each call is charged to ``rule`` (see ``limit_decorator``).

        ``key`` and ``cost`` are constants or callables given the call's arguments. A refused
        call raises ``RateLimitExceeded``; with ``wait`` it first waits up to that many seconds.
        """
        return limit_decorator(self, rule, key, cost, wait, is_async_limiter=False)

    def _decide(self, rule: Rule, op: Decide) -> Decision:
        try:
            return self._guarded_decide(op.plan, op.key, op.cost, op.max_wait, op.lease_id)
        except StoreError as exc:
            return self.failure_policy.decide(rule, op.plan, op.key, op.cost, op.max_wait, op.lease_id, None, True, exc)

    def _refund(self, rule: Rule, op: Refund) -> None:
        try:
            self.breaker.check()
            self.store.refund(op.plan, op.key, op.cost, op.lease_id)
        except StoreError as exc:
            self.failure_policy.refund(rule, op.plan, op.key, op.cost, op.lease_id, exc)
        else:
            self.breaker.record_success()

    def _guarded_decide(
        self,
        plan: Plan,
        key: str,
        cost: int,
        max_wait: int | None = None,
        lease_id: str | None = None,
        now: int | None = None,
        commit: bool = True,
    ) -> Decision:
        """``store.decide`` behind the breaker. ``try_acquire`` (the hot path) calls the store
        directly while all is well and this only after a failure, until the breaker is
        quiet again (``_route``); the other calls always come through here."""
        self.breaker.check()
        decision = self.store.decide(plan, key, cost, max_wait, lease_id, now, commit)
        self.breaker.record_success()
        return decision

    def _route(self, guarded: bool) -> None:
        self._store_decide = self._guarded_decide if guarded else self.store.decide

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Limiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
