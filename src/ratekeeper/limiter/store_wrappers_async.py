"""The stores an ``AsyncLimiter`` wraps around its own: ``AsyncObservedStore`` (each call
timed and reported to an ``Observer``) and ``AsyncOverLimitCache`` (remembered denials
answered in this process: ``DenialCache``).

This module is the source of ``store_wrappers.py`` (``ObservedStore``, ``OverLimitCache``,
for ``Limiter``): ``tools/unasync.py`` writes it, and a test fails when the two differ.
Edit this one, then run ``python tools/unasync.py``. What the wrappers report and why the
cache never admits more than the store would: ``observer.py`` and ``overlimit.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.limiter.observer import Reports, TimedCall
from ratekeeper.op import CHARGE, DECIDE

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.limiter.observer import Observer
    from ratekeeper.limiter.overlimit import DenialCache
    from ratekeeper.op import Op
    from ratekeeper.stores.base import AsyncStore

__all__ = ["AsyncObservedStore", "AsyncOverLimitCache"]


class AsyncObservedStore:
    """A store that times each call of ``store`` and reports it, the decisions of DECIDE
    ops, and (to an observer that takes them) charges and refunds, to ``observer``."""

    def __init__(self, store: AsyncStore, observer: Observer) -> None:
        self.store = store
        self.observer = observer
        self.clock = getattr(store, "clock", None)
        # The optional reports, looked up once: the per-call cost is a test of an attribute.
        self._reports = reports = Reports(observer)
        self._decided_key = reports.decided_key
        self._refunded = reports.refunded

    async def decide(self, op: Op, now: int | None = None) -> Decision:
        with TimedCall(self.observer):
            decision = await self.store.decide(op, now)
        mode = op[0]
        if mode == DECIDE:
            if self._decided_key is None:
                self.observer.decided(decision)
            else:
                self._decided_key(decision, op[2])
        elif mode == CHARGE:
            self._reports.charge(decision, op[3], op[2])
        return decision

    async def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        with TimedCall(self.observer):
            decisions = await self.store.decide_many(ops, now)
        decided_key = self._decided_key
        if decided_key is None:
            for decision in decisions:
                self.observer.decided(decision)
        else:
            for op, decision in zip(ops, decisions, strict=True):
                decided_key(decision, op[2])
        return decisions

    async def refund(self, op: Op, now: int | None = None) -> bool:
        with TimedCall(self.observer):
            given = await self.store.refund(op, now)
        # A lease's release gives back a slot, not cost: not a refund to count.
        if given and self._refunded is not None and op[5] is None and op[3] > 0:
            self._refunded(op[1].name, op[3])
        return given

    async def reset(self, plan: Plan, key: str) -> None:
        with TimedCall(self.observer):
            await self.store.reset(plan, key)

    async def aclose(self) -> None:
        await self.store.aclose()


class AsyncOverLimitCache:
    """A store that answers remembered denials itself and asks ``store`` otherwise."""

    def __init__(self, store: AsyncStore, cache: DenialCache) -> None:
        self.store = store
        self.cache = cache
        self.clock = getattr(store, "clock", None)

    async def decide(self, op: Op, now: int | None = None) -> Decision:
        if now is not None:  # an explicit time (tests, conformance): the store's answer, always
            return await self.store.decide(op, now)
        cached, sent = self.cache.lookup(op)
        if cached is not None:
            return cached
        decision = await self.store.decide(op, now)
        self.cache.remember(op, decision, sent)
        return decision

    async def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        sent = self.cache.clock.now_us()
        decisions = await self.store.decide_many(ops, now)
        if now is None:
            for op, decision in zip(ops, decisions, strict=True):
                self.cache.remember(op, decision, sent)
        return decisions

    async def refund(self, op: Op, now: int | None = None) -> bool:
        self.cache.forget(op[1], op[2])
        return await self.store.refund(op, now)

    async def reset(self, plan: Plan, key: str) -> None:
        self.cache.forget(plan, key)
        await self.store.reset(plan, key)

    async def aclose(self) -> None:
        await self.store.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)
