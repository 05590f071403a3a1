"""``AsyncLimiter``: decide, for a rule, a key and a cost, whether a request may proceed.

This module is the source of ``limiter.py``: ``tools/unasync.py`` writes the blocking
``Limiter`` from it (``async def`` → ``def``, no ``await``, ``run_async`` → ``run_sync``),
and a test fails when the two differ. Edit this one, then run ``python tools/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

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
from ratekeeper.flows import Decide, Refund, acquire_flow, run_async
from ratekeeper.lease import AsyncLease
from ratekeeper.rule import MAX_KEY_LENGTH, Rule
from ratekeeper.stores.base import AsyncStore, Store
from ratekeeper.stores.url import open_async_store

__all__ = ["AsyncLimiter"]

F = TypeVar("F", bound=Callable[..., Any])


class AsyncLimiter:
    """Decides, for a rule, a key and a cost, whether a request may proceed.

    ``AsyncLimiter("memory://")`` (the default) keeps state in this process; any store
    object is accepted too. ``clock`` replaces the monotonic clock of the memory store and
    of every wait (``ratekeeper.testing.FakeClock`` in tests). Use it as a context manager
    to close the store on exit.
    """

    def __init__(
        self, store: str | AsyncStore | Store = "memory://", *, clock: Clock | None = None, **options: Any
    ) -> None:
        if clock is not None:
            options["clock"] = clock
        self.store: AsyncStore = open_async_store(store, **options)
        self.clock: Clock = getattr(self.store, "clock", None) or clock or SystemClock()
        self._store_decide = self.store.decide

    async def try_acquire(self, rule: Rule, key: str, cost: int = 1, *, now: int | None = None) -> Decision:
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
        return await self._store_decide(plan, key, cost, None, new_lease_id() if plan.leases else None, now)

    async def peek(self, rule: Rule, key: str, cost: int = 1, *, now: int | None = None) -> Decision:
        """What ``try_acquire`` would answer, without charging anything."""
        check(rule, key, cost)
        plan = plan_for(rule, key)
        if plan is None:
            return Decision.unlimited_for(rule.name)
        return await self.store.decide(plan, key, cost, None, None, now, False)

    async def acquire(self, rule: Rule, key: str, cost: int = 1, *, timeout: float | None = None) -> Decision:
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
        return await run_async(flow, self._decide, self._refund, self.clock)

    async def try_acquire_many(self, items: Iterable[tuple[Any, ...]]) -> BatchDecision:
        """Charge several (rule, key[, cost]) at once: all of them, or none."""
        resolved = resolve_items(items)
        items_ = batch_items(resolved)
        return batch_result(resolved, await self.store.decide_many(items_) if items_ else ())

    async def refund(self, rule: Rule, key: str, cost: int = 1, *, lease_id: str | None = None) -> None:
        """Give back ``cost`` charged earlier (the actual cost was lower than estimated)."""
        plan = refund_plan(rule, key, cost, lease_id)
        if plan is not None:
            await self.store.refund(plan, key, cost, lease_id)

    async def release(self, rule: Rule, key: str, lease_id: str) -> None:
        """Release a concurrency lease before it expires."""
        require_leases(rule)
        await self.refund(rule, key, 0, lease_id=lease_id)

    async def reset(self, rule: Rule, key: str) -> None:
        """Forget everything charged to ``key`` under ``rule``."""
        check(rule, key, 0)
        plan = plan_for(rule, key)
        if plan is not None:
            await self.store.reset(plan, key)

    def lease(self, rule: Rule, key: str, cost: int = 1, *, timeout: float | None = 0) -> AsyncLease:
        """A context manager holding a concurrency lease for its block.

        Waits up to ``timeout`` seconds for a free slot (0: do not wait), else raises
        ``RateLimitExceeded``; the lease is released on exit.
        """
        require_leases(rule)
        return AsyncLease(self, rule, key, cost, timeout)

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
        return limit_decorator(self, rule, key, cost, wait, is_async_limiter=True)

    async def _decide(self, op: Decide) -> Decision:
        return await self.store.decide(op.plan, op.key, op.cost, op.max_wait, op.lease_id)

    async def _refund(self, op: Refund) -> None:
        await self.store.refund(op.plan, op.key, op.cost, op.lease_id)

    async def aclose(self) -> None:
        await self.store.aclose()

    async def __aenter__(self) -> AsyncLimiter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
