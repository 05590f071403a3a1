"""The observer seam: what a limiter tells about its work, for metrics and logs.

``Limiter(store, observer=obs)`` (or ``AsyncLimiter``) reports to ``obs``:

- ``decided(decision)``: every decision that charges or refuses, as the store (or, when
  the store failed, the failure policy: ``decision.fallback`` is set) gave it: those of
  ``try_acquire``, of each step of ``acquire`` and of each item of ``try_acquire_many``.
  Not peeks, and not keys that no limit applies to (they never reach a store).
- ``store_call(seconds, error)``: each call made to the store: how long it took, and the
  ``StoreError`` it raised (None when it answered). A call the open circuit breaker
  refused is not a store call and is not reported here; its fallback decision is.
- ``breaker_changed(old, new)``: a transition of the circuit breaker (``CLOSED``,
  ``OPEN``, ``HALF_OPEN``).

Nothing is paid without an observer: the limiter then calls its store directly. With one,
the store is wrapped in ``ObservedStore`` / ``AsyncObservedStore``, which time each call;
the methods run on the caller's thread (or event loop) right after the call, so they
must be quick and must not block; an exception they raise reaches the caller.
Per-key data must not be kept by an exporter (keys are unbounded); the decision's
``rule`` name is the label.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Protocol

from ratekeeper.errors import StoreError
from ratekeeper.op import DECIDE

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op
    from ratekeeper.stores.base import AsyncStore, Store

__all__ = ["AsyncObservedStore", "ObservedStore", "Observer"]


class Observer(Protocol):
    """Receives a limiter's reports (see the module docstring). ``ratekeeper.testing``
    has ``RecordingObserver``, which keeps them all, for tests."""

    def decided(self, decision: Decision) -> None: ...

    def store_call(self, seconds: float, error: StoreError | None) -> None: ...

    def breaker_changed(self, old: str, new: str) -> None: ...


class _Timed:
    """Times one store call and reports it (with its ``StoreError``, if it raised one)."""

    __slots__ = ("observer", "start")

    def __init__(self, observer: Observer) -> None:
        self.observer = observer

    def __enter__(self) -> None:
        self.start = perf_counter()

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, StoreError):
            self.observer.store_call(perf_counter() - self.start, exc)


class ObservedStore:
    """A ``Store`` that times each call of ``store`` and reports it, and the decisions of
    DECIDE ops, to ``observer``."""

    def __init__(self, store: Store, observer: Observer) -> None:
        self.store = store
        self.observer = observer
        self.clock = getattr(store, "clock", None)

    def decide(self, op: Op, now: int | None = None) -> Decision:
        with _Timed(self.observer):
            decision = self.store.decide(op, now)
        if op.mode == DECIDE:
            self.observer.decided(decision)
        return decision

    def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        with _Timed(self.observer):
            decisions = self.store.decide_many(ops, now)
        for decision in decisions:
            self.observer.decided(decision)
        return decisions

    def refund(self, op: Op, now: int | None = None) -> bool:
        with _Timed(self.observer):
            return self.store.refund(op, now)

    def reset(self, plan: Plan, key: str) -> None:
        with _Timed(self.observer):
            self.store.reset(plan, key)

    def close(self) -> None:
        self.store.close()


class AsyncObservedStore:
    """The asyncio twin of ``ObservedStore``."""

    def __init__(self, store: AsyncStore, observer: Observer) -> None:
        self.store = store
        self.observer = observer
        self.clock = getattr(store, "clock", None)

    async def decide(self, op: Op, now: int | None = None) -> Decision:
        with _Timed(self.observer):
            decision = await self.store.decide(op, now)
        if op.mode == DECIDE:
            self.observer.decided(decision)
        return decision

    async def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        with _Timed(self.observer):
            decisions = await self.store.decide_many(ops, now)
        for decision in decisions:
            self.observer.decided(decision)
        return decisions

    async def refund(self, op: Op, now: int | None = None) -> bool:
        with _Timed(self.observer):
            return await self.store.refund(op, now)

    async def reset(self, plan: Plan, key: str) -> None:
        with _Timed(self.observer):
            await self.store.reset(plan, key)

    async def aclose(self) -> None:
        await self.store.aclose()
