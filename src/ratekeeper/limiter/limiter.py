"""``Limiter``: decide, for a rule, a key and a cost, whether a request may proceed; ``Lease``.

Generated from ``limiter_async.py`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ratekeeper.clock import Clock, SystemClock
from ratekeeper.decision import BatchDecision, Decision
from ratekeeper.errors import StoreError
from ratekeeper.limiter.breaker import CircuitBreaker
from ratekeeper.limiter.checks import (
    batch_ops,
    batch_result,
    charge_op,
    check_timeout,
    checked_plan,
    new_lease_id,
    refund_op,
    require_leases,
    resolve_items,
)
from ratekeeper.limiter.decorator import limit_decorator
from ratekeeper.limiter.failure import FailurePolicy
from ratekeeper.limiter.flows import Flow, Sleep, acquire_flow
from ratekeeper.limiter.lease_state import LeaseState
from ratekeeper.limiter.observer import Observer
from ratekeeper.limiter.overlimit import DEFAULT_MAX_KEYS, DenialCache
from ratekeeper.limiter.store_wrappers import ObservedStore, OverLimitCache
from ratekeeper.op import DECIDE, PEEK, REFUND, Op
from ratekeeper.rule import Rule
from ratekeeper.stores.base import Store
from ratekeeper.stores.url import in_process_decide, open_store

__all__ = ["Lease", "Limiter"]

F = TypeVar("F", bound=Callable[..., Any])


class Limiter:
    """Decides, for a rule, a key and a cost, whether a request may proceed.

    ``Limiter("memory://")`` (the default) keeps state in this process; any store
    object is accepted too. ``clock`` replaces the monotonic clock of the memory store and
    of every wait (``ratekeeper.testing.FakeClock`` in tests). Use it as a context manager
    to close the store on exit.

    When the store fails (``StoreError``; ``StoreTimeout`` after ``timeout`` seconds, the
    store's default when None), ``on_error`` answers: ``"raise"``, ``"allow"``, ``"deny"``
    or ``"local"`` (a rule's own ``on_error`` wins; see ``ratekeeper.limiter.failure``). The
    ``breaker`` (a ``CircuitBreaker``; default: open after 5 consecutive failures for 1 s;
    False: never open) stops calling a failing store, so each call then costs
    microseconds. ``failures`` counts what the policy did, per rule. ``observer`` (see
    ``ratekeeper.limiter.observer``) is told every decision, store call and breaker change
    (and charges and refunds, when it takes them); without one nothing is measured.
    ``over_limit_cache`` (True, a bound on its keys, or a ``DenialCache`` with a clock of
    its own) answers a key's denial in this process until its ``retry_after`` has passed
    (``ratekeeper.limiter.overlimit``: what it saves, and why it never admits more); a store
    that decides in this process needs none and is left as it is.
    """

    def __init__(
        self,
        store: str | Store = "memory://",
        *,
        clock: Clock | None = None,
        on_error: str = "raise",
        timeout: float | None = None,
        breaker: CircuitBreaker | bool = True,
        observer: Observer | None = None,
        over_limit_cache: bool | int | DenialCache = False,
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
        self.failure_policy = FailurePolicy(on_error, breaker, self.clock, type(self.store).__name__, observer)
        self.failures = self.failure_policy.stats
        self.observer = observer
        if observer is not None:
            self.store = ObservedStore(self.store, observer)
        self.over_limit_cache: DenialCache | None = None
        if over_limit_cache is not False and in_process_decide(self.store) is None:
            if not isinstance(over_limit_cache, DenialCache):
                bound = DEFAULT_MAX_KEYS if over_limit_cache is True else int(over_limit_cache)
                over_limit_cache = DenialCache(self.clock, bound)
            over_limit_cache.observer = observer
            self.over_limit_cache = over_limit_cache
            self.store = OverLimitCache(self.store, over_limit_cache)
        # A store deciding in this process without I/O is called directly, with the op's
        # fields (no Op built, no coroutine in between); observed or guarded calls go the
        # long way.
        self._in_process = in_process_decide(self.store)
        self._direct = self._in_process
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
        plan = checked_plan(rule, key, cost)
        if plan is None:
            return Decision.unlimited_for(rule.name)
        lease = new_lease_id() if plan.leases else None
        direct = self._direct
        if direct is not None:
            return direct(DECIDE, plan, key, cost, None, lease, now)
        op = Op((DECIDE, plan, key, cost, None, lease))
        try:
            return self._store_decide(op, now)
        except StoreError as exc:
            return self.failure_policy.decide(rule, op, now, exc)

    def peek(self, rule: Rule, key: str, cost: int = 1, *, now: int | None = None) -> Decision:
        """What ``try_acquire`` would answer, without charging anything."""
        plan = checked_plan(rule, key, cost)
        if plan is None:
            return Decision.unlimited_for(rule.name)
        return self._decide(rule, Op((PEEK, plan, key, cost, None, None)), now)

    def charge(self, rule: Rule, key: str, cost: int, *, now: int | None = None) -> Decision:
        """Charge ``cost`` to ``key`` under ``rule`` whatever is left; never refused, never waits.

        For a cost known only after the fact (a response's size, the tokens a model
        streamed): the key may go into debt, and is then refused until time has paid the
        debt back. Returns the decision after the charge, with ``remaining`` below zero while
        in debt (never below minus a limit's count, or its burst: a debt is at most one
        limit deep; see ``Algorithm.charge``). A concurrency rule refuses it
        (``InvalidRequest``): its slots are leases, which a charge does not take.
        """
        op = charge_op(rule, key, cost)
        if op is None:
            return Decision.unlimited_for(rule.name)
        return self._decide(rule, op, now)

    def acquire(self, rule: Rule, key: str, cost: int = 1, *, timeout: float | None = None) -> Decision:
        """Wait until ``cost`` is admitted, at most ``timeout`` seconds; else raise ``RateLimitExceeded``.

        Token bucket, GCRA and leaky bucket reserve the next free slot in one call and
        sleep until it: first come, first served across every process sharing the store.
        Interrupted or cancelled while sleeping, it gives the reservation back. The decision
        returned tells the ``delay`` it waited.
        """
        plan = checked_plan(rule, key, cost)
        timeout = check_timeout(timeout)
        if plan is None:
            return Decision.unlimited_for(rule.name)
        lease = new_lease_id() if plan.leases else None
        flow = acquire_flow(plan, key, cost, timeout, self.clock, lease)
        return self._run_flow(rule, flow)

    def try_acquire_many(self, items: Iterable[tuple[Any, ...]]) -> BatchDecision:
        """Charge several (rule, key[, cost]) at once: all of them, or none."""
        if isinstance(items, list | tuple) and len(items) == 1:
            item = items[0]
            if type(item) is tuple and len(item) in (2, 3):
                # One item is one decision: try_acquire's path (the in-process store called
                # directly; a server store's call coalesced with the other callers').
                return BatchDecision((self.try_acquire(*item),))
        resolved = resolve_items(items)
        ops = batch_ops(resolved)
        if not ops:
            return batch_result(resolved, ())
        try:
            with self.breaker:
                answers = self.store.decide_many(ops)
        except StoreError as exc:
            answers = self.failure_policy.decide_many(resolved, exc)
        return batch_result(resolved, answers)

    def refund(self, rule: Rule, key: str, cost: int = 1, *, lease_id: str | None = None) -> bool:
        """Give back ``cost`` charged earlier (the actual cost was lower than estimated).

        Returns whether it was given back: False when the key is not limited, names a lease
        it does not hold (expired, released, another key's), or the store failed under a
        failure policy that does not raise.
        """
        op = refund_op(rule, key, cost, lease_id)
        if op is None:
            return False
        return self._refund(rule, op)

    def release(self, rule: Rule, key: str, lease_id: str) -> bool:
        """Release a concurrency lease before it expires; whether this key held it (a lease
        that expired, was released, or is another key's releases nothing: False)."""
        require_leases(rule)
        return self.refund(rule, key, 0, lease_id=lease_id)

    def reset(self, rule: Rule, key: str) -> None:
        """Forget everything charged to ``key`` under ``rule``."""
        plan = checked_plan(rule, key, 0)
        if plan is None:
            return
        try:
            with self.breaker:
                self.store.reset(plan, key)
        except StoreError as exc:
            self.failure_policy.reset(rule, plan, key, exc)

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
        return limit_decorator(self, rule, key, cost, wait)

    def _run_flow(self, rule: Rule, flow: Flow[Decision]) -> Decision:
        """Do what ``flow`` asks (decide, refund, sleep) until it returns; an exception raised
        while doing it (a cancellation, an interruption) is handed to the flow, which decides
        what to undo."""
        result: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = flow.throw(error) if error is not None else flow.send(result)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            error = None
            result = None
            try:
                if isinstance(op, Sleep):
                    self.clock.sleep(op.seconds)
                elif op.mode == REFUND:
                    self._refund(rule, op)
                else:
                    result = self._decide(rule, op)
            except BaseException as exc:  # noqa: BLE001 - handed to the flow, which re-raises
                error = exc

    def _decide(self, rule: Rule, op: Op, now: int | None = None) -> Decision:
        """``op`` decided by the store behind the breaker, or by the failure policy."""
        try:
            return self._guarded_decide(op, now)
        except StoreError as exc:
            return self.failure_policy.decide(rule, op, now, exc)

    def _refund(self, rule: Rule, op: Op) -> bool:
        try:
            with self.breaker:
                return self.store.refund(op)
        except StoreError as exc:
            self.failure_policy.refund(rule, op, exc)
            return False

    def _guarded_decide(self, op: Op, now: int | None = None) -> Decision:
        """``store.decide`` behind the breaker. ``try_acquire`` (the hot path) calls the store
        directly while all is well and this only after a failure, until the breaker is
        quiet again (``_route``); the other calls always come through here."""
        with self.breaker:
            return self.store.decide(op, now)

    def _route(self, guarded: bool) -> None:
        self._store_decide = self._guarded_decide if guarded else self.store.decide
        self._direct = None if guarded else self._in_process

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Limiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Lease(LeaseState):
    """Holds one slot of a concurrency rule for the block it manages (``limiter.lease(rule, key)``).

    Entering waits up to ``timeout`` seconds (0: not at all) and raises
    ``RateLimitExceeded`` when no slot frees up; leaving releases the slot. A holder that
    dies without leaving frees its slot when the lease expires (the limit's period).
    """

    def __init__(self, limiter: Limiter, rule: Rule, key: str, cost: int, timeout: float | None) -> None:
        super().__init__(rule, key, cost, timeout)
        self._limiter = limiter

    def __enter__(self) -> Lease:
        self.check_free()
        if self.timeout == 0:
            self.granted(self._limiter.try_acquire(self.rule, self.key, self.cost))
        else:
            self.granted(self._limiter.acquire(self.rule, self.key, self.cost, timeout=self.timeout))
        return self

    def release(self) -> None:
        lease_id = self.take_for_release()
        if lease_id is not None:
            self._limiter.release(self.rule, self.key, lease_id)

    def __exit__(self, *exc: object) -> None:
        self.release()
