"""The embedded store: a striped, bounded, self-expiring dict in this process.

Keys hash to one of ``stripes`` stripes, each with its own lock, so threads deciding
for different keys rarely wait on each other and no lock is global. Each stripe keeps
two generations of keys (plain dicts): every write goes to the young one; a key found
only in the old one moves to the young one when it is written. When the young
generation is full (``max_keys / (2 * stripes)`` keys) it becomes the old one and the
previous old one is dropped whole: those are exactly the stripe's least recently used
keys, so a flood of unique keys never holds more than ``max_keys`` per rule.

Idle keys expire without a sweeper thread and without a per-key timer. Every rule has a
horizon: the time after which any state it writes is whole again (its longest period,
or the time a bucket takes to refill). Each generation remembers its last write; once a
second, on some call, every generation last written more than a horizon ago is dropped
(all its keys are whole), and an empty old generation takes the young keys, so keys in
use move back to the young one as they are written and idle ones age out. Reservations
made by ``acquire`` reach further than the horizon; a stripe holding one drops nothing
until it passes. A refund or release that leaves a key whole deletes it at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.clock import Clock, SystemClock
from ratekeeper.errors import ConfigurationError
from ratekeeper.op import DECIDE, Op
from ratekeeper.stores.bounds import check_op

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision

__all__ = ["MemoryStore"]

_MISSING: Any = object()
_monotonic_ns = time.monotonic_ns
SWEEP_EVERY_US = 1_000_000


class _Stripe:
    __slots__ = ("capacity", "evicted", "hold", "lock", "old", "old_last", "young", "young_last")

    def __init__(self, capacity: int) -> None:
        self.lock = threading.Lock()
        self.capacity = capacity
        self.young: dict[str, Any] = {}
        self.old: dict[str, Any] = {}
        self.young_last = 0  # the last write into each generation
        self.old_last = 0
        self.hold = 0  # the end of the latest reservation made in this stripe
        self.evicted = 0

    def load(self, key: str) -> tuple[Any, bool]:
        """The key's state (None when absent) and whether it sits in the old generation."""
        state = self.young.get(key, _MISSING)
        if state is _MISSING:
            state = self.old.get(key) if self.old else None
            return state, state is not None
        return state, False

    def store(self, key: str, state: Any, now: int) -> None:
        young = self.young
        if now > self.young_last:  # the latest write: a clock that stepped back must not age newer states
            self.young_last = now
        if key in young:
            young[key] = state
            return
        if self.old:
            self.old.pop(key, None)
        young[key] = state
        if len(young) >= self.capacity:
            self.evicted += len(self.old)
            self.rotate(now)

    def reserve(self, until: int) -> None:
        """A reservation reaches ``until``: nothing in this stripe expires before then."""
        if until > self.hold:
            self.hold = until

    def expire(self, now: int, horizon: int) -> None:
        """Drop each generation once all of it is whole; set the young one aside."""
        if now >= self.hold:
            if self.old and now >= self.old_last + horizon:
                self.old = {}
            if self.young and now >= self.young_last + horizon:
                self.young = {}
        if not self.old and self.young:
            self.rotate(now)

    def rotate(self, now: int) -> None:
        self.old = self.young
        self.old_last = self.young_last
        self.young = {}


class _Table:
    """The keys of one rule whose states read alike (``Plan.table``)."""

    __slots__ = ("horizon", "mask", "name", "plan", "stripes")

    def __init__(self, stripes: int, capacity: int, plan: Plan) -> None:
        self.mask = stripes - 1
        self.stripes = [_Stripe(capacity) for _ in range(stripes)]
        self.name = plan.name
        self.plan = plan
        self.horizon = plan.horizon

    def adopt(self, plan: Plan) -> None:
        """Another plan writes here (a quota's limits): the horizon covers the longest.
        Called with the store's table lock held, so the horizon only ever grows."""
        self.plan = plan
        if plan.horizon > self.horizon:
            self.horizon = plan.horizon


class MemoryStore:
    """The in-process store (``memory://``).

    ``max_keys`` bounds the keys kept per rule (least recently used evicted first);
    ``stripes`` (a power of two) is the number of independent locks per rule; ``clock``
    gives "now" in microseconds (``SystemClock``: the monotonic clock).
    """

    def __init__(self, max_keys: int = 1_000_000, stripes: int = 64, clock: Clock | None = None) -> None:
        if type(max_keys) is not int or max_keys < 2:
            raise ConfigurationError(f"max_keys must be an integer of at least 2, got {max_keys!r}")
        if type(stripes) is not int or stripes < 1 or stripes & (stripes - 1):
            raise ConfigurationError(f"stripes must be a power of two, got {stripes!r}")
        while stripes > 1 and max_keys // (2 * stripes) < 1:
            stripes //= 2
        self.max_keys = max_keys
        self.stripes = stripes
        self._capacity = max(1, max_keys // (2 * stripes))
        self.clock: Clock = clock or SystemClock()
        self._now: Callable[[], int] = self.clock.now_us
        self._system_clock = type(self.clock) is SystemClock  # read inline on the hot path
        self._tables: dict[str, _Table] = {}
        self._tables_lock = threading.Lock()
        self._next_sweep = self._now() + SWEEP_EVERY_US

    # -- plumbing -----------------------------------------------------------------------

    def _table(self, plan: Plan) -> _Table:
        table = self._tables.get(plan.table)
        if table is None or plan is not table.plan:
            with self._tables_lock:
                table = self._tables.get(plan.table)
                if table is None:
                    table = self._tables[plan.table] = _Table(self.stripes, self._capacity, plan)
                elif plan is not table.plan:
                    table.adopt(plan)
        return table

    def _stripe(self, plan: Plan, key: str) -> _Stripe:
        table = self._table(plan)
        return table.stripes[hash(key) & table.mask]

    # -- the Store role -----------------------------------------------------------------

    in_process = True
    """Decides in this process without I/O: the limiters call ``decide_fields`` directly."""

    def decide(self, op: Op, now: int | None = None) -> Decision:
        check_op(op, now)  # decide_fields, the limiters' path, has their checks instead
        mode, plan, key, cost, max_wait, lease_id = op
        return self.decide_fields(mode, plan, key, cost, max_wait, lease_id, now)

    def decide_fields(
        self,
        mode: str,
        plan: Plan,
        key: str,
        cost: int,
        max_wait: int | None,
        lease_id: str | None,
        now: int | None = None,
    ) -> Decision:
        """``decide(op, now)`` with the op's fields as arguments: the limiters' hot path on an
        in-process store, where building the ``Op`` would cost as much as the dict lookups."""
        commit = mode == DECIDE
        table = self._tables.get(plan.table)
        if table is None or plan is not table.plan:
            table = self._table(plan)
        stripe = table.stripes[hash(key) & table.mask]
        lock = stripe.lock
        lock.acquire()
        try:
            if now is None:
                now = _monotonic_ns() // 1000 if self._system_clock else self._now()
            state = stripe.young.get(key, _MISSING)
            if state is not _MISSING:
                new, decision = plan.decide(state, now, cost, max_wait, lease_id)
                if new is not state and commit:
                    stripe.young[key] = new
                    if now > stripe.young_last:
                        stripe.young_last = now
                    if max_wait and decision.delay_us:
                        stripe.reserve(now + max(decision.reset_us))
            else:
                state, in_old = stripe.load(key)
                new, decision = plan.decide(state, now, cost, max_wait, lease_id)
                if commit and (new is not state or in_old):
                    if max_wait and decision.delay_us:
                        stripe.reserve(now + max(decision.reset_us))
                    stripe.store(key, new, now)
        finally:
            lock.release()
        if now >= self._next_sweep:
            self._sweep(now)
        return decision

    def _sweep(self, now: int) -> None:
        """At most once a second: let every stripe of every rule drop what is whole."""
        self._next_sweep = now + SWEEP_EVERY_US
        for table in self._snapshot():
            for stripe in table.stripes:
                with stripe.lock:
                    stripe.expire(now, table.horizon)

    def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        for op in ops:
            check_op(op, now)
        stripes = [self._stripe(op.plan, op.key) for op in ops]
        ordered = sorted({id(s): s for s in stripes}.values(), key=id)
        for s in ordered:
            s.lock.acquire()
        try:
            if now is None:
                now = self._now()
            loaded: dict[tuple[int, str], tuple[Any, bool]] = {}
            pending: dict[tuple[int, str], Any] = {}
            decisions: list[Decision] = []
            for (_, plan, key, cost, _, lease_id), stripe in zip(ops, stripes, strict=True):
                slot = (id(stripe), key)
                if slot not in loaded:
                    loaded[slot] = stripe.load(key)
                    pending[slot] = loaded[slot][0]
                pending[slot], decision = plan.decide(pending[slot], now, cost, None, lease_id)
                decisions.append(decision)
            if all(d.allowed for d in decisions):
                for (_, _, key, *_), stripe in zip(ops, stripes, strict=True):
                    slot = (id(stripe), key)
                    state, in_old = loaded.pop(slot, (None, False))
                    if slot in pending and (pending[slot] is not state or in_old):
                        stripe.store(key, pending.pop(slot), now)
        finally:
            for s in reversed(ordered):
                s.lock.release()
        if now >= self._next_sweep:
            self._sweep(now)
        return tuple(decisions)

    def refund(self, op: Op, now: int | None = None) -> bool:
        """Give ``op``'s cost back, or release its lease; whether it gave anything back (the
        lease was held under this rule and key; a cost: the key had a state)."""
        check_op(op, now)
        _, plan, key, cost, _, lease_id = op
        stripe = self._stripe(plan, key)
        with stripe.lock:
            if now is None:
                now = self._now()
            state, _ = stripe.load(key)
            if state is None:
                return False
            held = True
            if plan.leases:  # a live lease of this key by that id (never another key's)
                _, before = plan.decide(state, now, 0, None, None)
            new = plan.algorithm.refund(plan, state, now, cost, lease_id)
            _, check = plan.decide(new, now, 0, None, None)
            if plan.leases:
                held = check.remaining_each != before.remaining_each
            if max(check.reset_us) <= 0:  # whole again: nothing worth keeping
                stripe.young.pop(key, None)
                stripe.old.pop(key, None)
            else:
                stripe.store(key, new, now)
        return held

    def reset(self, plan: Plan, key: str) -> None:
        stripe = self._stripe(plan, key)
        with stripe.lock:
            stripe.young.pop(key, None)
            stripe.old.pop(key, None)

    def close(self) -> None:
        self._tables.clear()

    # -- introspection ------------------------------------------------------------------

    def key_count(self, rule: str | None = None) -> int:
        """Keys held (for one rule, or all); idle keys leave within a horizon and a second or two."""
        tables = [t for t in self._snapshot() if rule is None or t.name == rule]
        return sum(len(s.young) + len(s.old) for t in tables for s in t.stripes)

    @property
    def evicted(self) -> int:
        """Keys dropped by the ``max_keys`` bound (not by expiry) so far."""
        return sum(s.evicted for t in self._snapshot() for s in t.stripes)

    def _snapshot(self) -> list[_Table]:
        with self._tables_lock:
            return list(self._tables.values())
