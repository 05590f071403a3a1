"""The stores a ``Limiter`` wraps around its own: ``ObservedStore`` and ``OverLimitCache``.

Generated from ``store_wrappers_async.py`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
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
    from ratekeeper.stores.base import Store

__all__ = ["ObservedStore", "OverLimitCache"]


class ObservedStore:
    """A store that times each call of ``store`` and reports it, the decisions of DECIDE
    ops, and (to an observer that takes them) charges and refunds, to ``observer``."""

    def __init__(self, store: Store, observer: Observer) -> None:
        self.store = store
        self.observer = observer
        self.clock = getattr(store, "clock", None)
        # The optional reports, looked up once: the per-call cost is a test of an attribute.
        self._reports = reports = Reports(observer)
        self._decided_key = reports.decided_key
        self._refunded = reports.refunded

    def decide(self, op: Op, now: int | None = None) -> Decision:
        with TimedCall(self.observer):
            decision = self.store.decide(op, now)
        mode = op[0]
        if mode == DECIDE:
            if self._decided_key is None:
                self.observer.decided(decision)
            else:
                self._decided_key(decision, op[2])
        elif mode == CHARGE:
            self._reports.charge(decision, op[3], op[2])
        return decision

    def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        with TimedCall(self.observer):
            decisions = self.store.decide_many(ops, now)
        decided_key = self._decided_key
        if decided_key is None:
            for decision in decisions:
                self.observer.decided(decision)
        else:
            for op, decision in zip(ops, decisions, strict=True):
                decided_key(decision, op[2])
        return decisions

    def refund(self, op: Op, now: int | None = None) -> bool:
        with TimedCall(self.observer):
            given = self.store.refund(op, now)
        # A lease's release gives back a slot, not cost: not a refund to count.
        if given and self._refunded is not None and op[5] is None and op[3] > 0:
            self._refunded(op[1].name, op[3])
        return given

    def reset(self, plan: Plan, key: str) -> None:
        with TimedCall(self.observer):
            self.store.reset(plan, key)

    def close(self) -> None:
        self.store.close()


class OverLimitCache:
    """A store that answers remembered denials itself and asks ``store`` otherwise."""

    def __init__(self, store: Store, cache: DenialCache) -> None:
        self.store = store
        self.cache = cache
        self.clock = getattr(store, "clock", None)

    def decide(self, op: Op, now: int | None = None) -> Decision:
        if now is not None:  # an explicit time (tests, conformance): the store's answer, always
            return self.store.decide(op, now)
        cached, sent = self.cache.lookup(op)
        if cached is not None:
            return cached
        decision = self.store.decide(op, now)
        self.cache.remember(op, decision, sent)
        return decision

    def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        sent = self.cache.clock.now_us()
        decisions = self.store.decide_many(ops, now)
        if now is None:
            for op, decision in zip(ops, decisions, strict=True):
                self.cache.remember(op, decision, sent)
        return decisions

    def refund(self, op: Op, now: int | None = None) -> bool:
        self.cache.forget(op[1], op[2])
        return self.store.refund(op, now)

    def reset(self, plan: Plan, key: str) -> None:
        self.cache.forget(plan, key)
        self.store.reset(plan, key)

    def close(self) -> None:
        self.store.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)
