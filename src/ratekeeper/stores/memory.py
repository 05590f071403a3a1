"""The embedded store: a striped, bounded, self-expiring dict in this process.

Keys hash to one of ``stripes`` stripes, each with its own lock, so threads deciding
for different keys rarely wait on each other and no lock is global. A stripe is made
when its table's first key hashes to it, so a rule with few keys costs little. Each
stripe keeps two generations of keys (plain dicts): every write goes to the young one; a
key found only in the old one moves to the young one when it is written. When the young
generation is full (``max_keys / (2 * stripes)`` keys) it becomes the old one and the
previous old one is dropped whole: those are exactly the stripe's least recently used
keys, so a flood of unique keys never holds more than ``max_keys`` per rule.

Idle keys expire without a sweeper thread and without a per-key timer. Every rule has a
horizon: the time after which any state it writes is whole again (its longest period,
or the time a bucket takes to refill). Each generation remembers its last write; when a
table is swept, every generation last written more than a horizon ago is dropped (all
its keys are whole), and an empty old generation takes the young keys, so keys in use
move back to the young one as they are written and idle ones age out. Reservations made
by ``acquire`` reach further than the horizon; a stripe holding one drops nothing until
it passes. A refund or release that leaves a key whole deletes it at once.

The sweep runs on some call, on the caller's thread, and visits at most
``SWEEP_TABLES`` tables per call, in turn (a table swept goes to the back of the line):
a caller never pays for a walk of every table, however many rules there are. With few
tables each is swept about once a second; with more, slices come more often (at most
one per ``SWEEP_GAP_US``) and a round takes longer. A table whose keys have all expired
is dropped, and ``forget`` drops a rule's tables at once (an Envoy override rule evicted
from its bounded cache): the tables a rule leaves behind do not outlive it. A call that
raced with the drop of its table sees the table marked dead once it holds the stripe's
lock and starts again on a fresh table, so no write lands in a dropped table unseen.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from ratekeeper.clock import EPOCH_OFFSET_NS, Clock, SystemClock
from ratekeeper.errors import ConfigurationError
from ratekeeper.op import CHARGE, DECIDE, Op
from ratekeeper.stores.bounds import check_op

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision

__all__ = ["MemoryStore"]

_MISSING: Any = object()
_MAKING = threading.Lock()
"""Held to make a table's stripe, and while a table is dropped: a stripe made then is made
dead. Never held while waiting on another lock (the drop only tries the stripes')."""
_monotonic_ns = time.monotonic_ns
SWEEP_EVERY_US = 1_000_000
"""How often each table is swept while there are at most ``SWEEP_TABLES`` of them."""
SWEEP_TABLES = 8
"""The most tables one sweep visits: the bound on what a sweep costs its caller."""
SWEEP_GAP_US = 10_000
"""The least time between two sweeps, however many tables wait for one."""


class _Stripe:
    __slots__ = ("capacity", "dead", "evicted", "hold", "lock", "old", "old_last", "young", "young_last")

    def __init__(self, capacity: int) -> None:
        self.lock = threading.Lock()
        self.capacity = capacity
        self.young: dict[str, Any] = {}
        self.old: dict[str, Any] = {}
        self.young_last = 0  # the last write into each generation
        self.old_last = 0
        self.hold = 0  # the end of the latest reservation made in this stripe
        self.evicted = 0
        self.dead = False  # its table was dropped: a caller holding the lock must start again

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

    def empty(self) -> bool:
        return not self.young and not self.old


class _Table:
    """The keys of one rule whose states read alike (``Plan.table``)."""

    __slots__ = ("capacity", "dead", "horizon", "mask", "name", "plan", "stripes")

    def __init__(self, stripes: int, capacity: int, plan: Plan) -> None:
        self.mask = stripes - 1
        # Each stripe is made on its first key (``stripe``): a rule with few keys (an
        # Envoy override rule, say) costs a stripe or two, not all of them.
        self.stripes: list[_Stripe | None] = [None] * stripes
        self.capacity = capacity
        self.dead = False
        self.name = plan.name
        self.plan = plan
        self.horizon = plan.horizon

    def stripe(self, i: int) -> _Stripe:
        """Stripe ``i``, made when missing (dead when the table is)."""
        with _MAKING:
            stripe = self.stripes[i]
            if stripe is None:
                stripe = self.stripes[i] = _Stripe(self.capacity)
                stripe.dead = self.dead
            return stripe

    def made(self) -> list[_Stripe]:
        """The stripes made so far."""
        return [s for s in self.stripes if s is not None]

    def adopt(self, plan: Plan) -> None:
        """Another plan writes here (a quota's limits): the horizon covers the longest.
        Called with the store's table lock held, so the horizon only ever grows."""
        self.plan = plan
        if plan.horizon > self.horizon:
            self.horizon = plan.horizon

    def expire(self, now: int) -> bool:
        """Let every stripe drop what is whole; whether the table is now empty."""
        empty = True
        for stripe in self.made():
            with stripe.lock:
                stripe.expire(now, self.horizon)
                empty = empty and stripe.empty()
        return empty

    def drop_if_empty(self, unlink: Callable[[_Table], None]) -> bool:
        """When every stripe is empty: mark them dead and ``unlink`` the table from the
        store, holding all their locks, so a caller waiting on one sees it dead and never
        finds the table again. False (nothing done) when a stripe is busy or holds a key.
        Never waits for a stripe's lock: a busy table is not idle, and waiting could
        deadlock with ``decide_many``, which holds several."""
        held: list[threading.Lock] = []
        with _MAKING:
            try:
                stripes = self.made()
                for stripe in stripes:
                    if not stripe.lock.acquire(blocking=False):
                        return False
                    held.append(stripe.lock)
                    if not stripe.empty():
                        return False
                self.kill(stripes)
                unlink(self)
                return True
            finally:
                for lock in held:
                    lock.release()

    def kill(self, stripes: list[_Stripe]) -> None:
        """Mark the table and its ``stripes`` dead; ``_MAKING`` held."""
        self.dead = True
        for stripe in stripes:
            stripe.dead = True


class MemoryStore:
    """The in-process store (``memory://``).

    ``max_keys`` bounds the keys kept per rule (least recently used evicted first);
    ``stripes`` (a power of two) is the number of independent locks per rule; ``clock``
    gives "now" in microseconds (``SystemClock``: the monotonic clock counted from the Unix
    epoch, so fixed windows align as on the server stores).
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
        # In sweep order: a table swept moves to the end (``move_to_end``).
        self._tables: OrderedDict[str, _Table] = OrderedDict()
        self._tables_lock = threading.Lock()
        self._next_sweep = self._now() + SWEEP_EVERY_US
        self.swept_tables = 0
        """Tables visited by the sweep so far (each sweep adds at most ``SWEEP_TABLES``)."""
        self.dropped_tables = 0
        """Tables dropped so far: empty ones by the sweep, and those ``forget`` dropped."""

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
        i = hash(key) & table.mask
        return table.stripes[i] or table.stripe(i)

    def _locked_stripe(self, plan: Plan, key: str) -> _Stripe:
        """The key's stripe, its lock held, in a table still in the store."""
        while True:
            stripe = self._stripe(plan, key)
            stripe.lock.acquire()
            if not stripe.dead:
                return stripe
            stripe.lock.release()

    # -- the Store role -----------------------------------------------------------------

    in_process = True
    """Decides in this process without I/O: the limiters call ``decide_fields`` directly."""

    def decide(self, op: Op, now: int | None = None) -> Decision:
        check_op(op, now)  # decide_fields, the limiters' path, has their checks instead
        mode, plan, key, cost, max_wait, lease_id = op
        if mode == CHARGE:
            return self._charge(plan, key, cost, now)
        return self.decide_fields(mode, plan, key, cost, max_wait, lease_id, now)

    def _charge(self, plan: Plan, key: str, cost: int, now: int | None) -> Decision:
        """A CHARGE op (``Algorithm.charge``): written whatever the key holds. A debt may
        outlast the rule's horizon, so the stripe keeps it as it keeps a reservation."""
        stripe = self._locked_stripe(plan, key)
        try:
            if now is None:
                now = self._now()
            state, in_old = stripe.load(key)
            new, decision = plan.algorithm.charge(plan, state, now, cost)
            if new is not state or in_old:
                stripe.reserve(now + max(decision.reset_us))
                stripe.store(key, new, now)
        finally:
            stripe.lock.release()
        if now >= self._next_sweep:
            self._sweep(now)
        return decision

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
        in-process store, where building the ``Op`` would cost as much as the dict lookups.
        For DECIDE and PEEK (a CHARGE goes through ``decide``)."""
        commit = mode == DECIDE
        table = self._tables.get(plan.table)
        if table is None or plan is not table.plan:
            table = self._table(plan)
        i = hash(key) & table.mask
        stripe = table.stripes[i] or table.stripe(i)
        lock = stripe.lock
        lock.acquire()
        if stripe.dead:  # its table was dropped after we found it: decide on a fresh one
            lock.release()
            return self.decide_fields(mode, plan, key, cost, max_wait, lease_id, now)
        try:
            if now is None:
                now = (_monotonic_ns() + EPOCH_OFFSET_NS) // 1000 if self._system_clock else self._now()
            state = stripe.young.get(key, _MISSING)
            if state is not _MISSING:
                # A key of the young generation, the common case: written in place, without
                # the calls of ``load`` and ``store`` (which the other keys take).
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
        """Sweep the next ``SWEEP_TABLES`` tables in turn; drop those left empty."""
        with self._tables_lock:
            tables = self._tables
            count = len(tables)
            names = list(islice(tables, SWEEP_TABLES))
            for name in names:
                tables.move_to_end(name)
            visit = [tables[name] for name in names]
        # Each table about once a second when a round takes one slice; more slices (never
        # closer than SWEEP_GAP_US) when there are more tables.
        every = SWEEP_EVERY_US if count <= SWEEP_TABLES else SWEEP_EVERY_US * SWEEP_TABLES // count
        self._next_sweep = now + max(every, SWEEP_GAP_US)
        self.swept_tables += len(visit)
        for table in visit:
            if table.expire(now):
                table.drop_if_empty(self._unlink)

    def _unlink(self, table: _Table) -> None:
        """Take ``table`` out of the store. Called holding its stripes' locks: the table
        lock is only ever taken after those, never before."""
        with self._tables_lock:
            if self._tables.get(table.plan.table) is table:
                del self._tables[table.plan.table]
                self.dropped_tables += 1

    def forget(self, plan: Plan) -> bool:
        """Drop the table ``plan`` writes to, with every key in it: its rule is gone (e.g. an
        Envoy override rule evicted from its bounded cache). Whether there was one. A call
        deciding on it at that moment may still write there; that write is dropped too."""
        with self._tables_lock:
            table = self._tables.pop(plan.table, None)
            if table is None:
                return False
            self.dropped_tables += 1
        with _MAKING:
            table.kill(table.made())
        return True

    def table_count(self) -> int:
        """Tables held: one per rule (per quota tier's scale) with state, or not yet swept."""
        return len(self._tables)

    def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        for op in ops:
            check_op(op, now)
        stripes = [self._stripe(op.plan, op.key) for op in ops]
        ordered = sorted({id(s): s for s in stripes}.values(), key=id)
        for s in ordered:
            s.lock.acquire()
        if any(s.dead for s in ordered):  # a table was dropped after we found it
            for s in reversed(ordered):
                s.lock.release()
            return self.decide_many(ops, now)
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
        """Give ``op``'s cost back, or release its lease; False for a lease this rule and key
        did not hold (the stores' ``refund`` result), else True."""
        check_op(op, now)
        _, plan, key, cost, _, lease_id = op
        stripe = self._locked_stripe(plan, key)
        try:
            if now is None:
                now = self._now()
            state, _ = stripe.load(key)
            if state is None:
                return not plan.leases
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
        finally:
            stripe.lock.release()
        return held

    def reset(self, plan: Plan, key: str) -> None:
        stripe = self._locked_stripe(plan, key)
        try:
            stripe.young.pop(key, None)
            stripe.old.pop(key, None)
        finally:
            stripe.lock.release()

    def close(self) -> None:
        self._tables.clear()

    # -- introspection ------------------------------------------------------------------

    def key_count(self, rule: str | None = None) -> int:
        """Keys held (for one rule, or all); idle keys leave within a horizon and a second or two."""
        tables = [t for t in self._snapshot() if rule is None or t.name == rule]
        return sum(len(s.young) + len(s.old) for t in tables for s in t.made())

    @property
    def evicted(self) -> int:
        """Keys dropped by the ``max_keys`` bound (not by expiry) so far."""
        return sum(s.evicted for t in self._snapshot() for s in t.made())

    def _snapshot(self) -> list[_Table]:
        with self._tables_lock:
            return list(self._tables.values())
