"""Random traces, the reference model, and the session that compares a store with it.

A ``Trace`` is a few rules (``RuleSpec``), a number of keys, a starting time (µs) and a
list of operations: ``Advance`` (the clock moves, sometimes back), ``Acquire`` (decide and
charge; with ``max_wait`` for the reserving algorithms), ``Peek`` (decide, charge
nothing), ``Refund``, ``Release`` (of a concurrency lease), ``Reset`` and ``Batch``
(``decide_many``, all or nothing). ``Session`` applies each operation at the same explicit
``now`` to the store under test and to ``Reference`` (a dict of states driven by the pure
algorithms, batches as ``MemoryStore.decide_many``), and fails on the first decision that
differs in any field, naming the operation, the time and the field.

The clock may step back anywhere (never below 0). A store may forget a state once it is
whole again, which only matters after such a step: the reference then accepts the
decision of either the state kept or the state forgotten, and nothing else (see
``Reference``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.algorithms.base import UNBOUNDED_WAIT, Plan
from ratekeeper.decision import Decision
from ratekeeper.limit import Limit
from ratekeeper.op import Op as StoreOp
from ratekeeper.rule import Rule

__all__ = [
    "ALGORITHM_NAMES",
    "EPOCH_US",
    "HOUR_US",
    "LEASING",
    "RESERVING",
    "STARTS",
    "Acquire",
    "Advance",
    "Batch",
    "Charge",
    "Op",
    "Peek",
    "Reference",
    "Refund",
    "Release",
    "Reset",
    "RuleSpec",
    "Session",
    "Trace",
    "examples",
    "rule_specs",
    "traces",
]

ALGORITHM_NAMES = tuple(ALGORITHMS)
BURSTY = frozenset(name for name, algo in ALGORITHMS.items() if algo.uses_burst)
RESERVING = frozenset(name for name, algo in ALGORITHMS.items() if algo.reserves)
LEASING = frozenset(name for name, algo in ALGORITHMS.items() if algo.uses_leases)

HOUR_US = 3_600_000_000
EPOCH_US = 1_750_000_000_000_000
"""Microseconds since the epoch in 2025, as Redis ``TIME`` and ``clock_timestamp()`` give."""

FIELDS = (
    "rule",
    "limits",
    "allowed",
    "denied_index",
    "retry_us",
    "delay_us",
    "remaining",
    "reset_us",
    "lease_id",
    "fallback",
)
"""The fields of a ``Decision`` tuple, in order."""


# --------------------------------------------------------------------------- the trace


@dataclass(frozen=True)
class RuleSpec:
    """One rule of a trace: its algorithm and limits (the session names it)."""

    algorithm: str
    limits: tuple[Limit, ...]

    def build(self, name: str) -> Rule:
        return Rule(name, self.limits, self.algorithm)

    @property
    def capacity(self) -> int:
        return max(limit.capacity for limit in self.limits)

    def __repr__(self) -> str:
        return f"RuleSpec({self.algorithm!r}, {[str(limit) for limit in self.limits]!r})"


@dataclass(frozen=True)
class Advance:
    """The clock moves by ``us`` µs; negative: it steps back (never below ``Reference.floor``)."""

    us: int


@dataclass(frozen=True)
class Acquire:
    """``decide`` and charge: ``try_acquire`` (``max_wait`` None) or ``acquire``'s reservation."""

    rule: int
    key: int
    cost: int
    max_wait: int | None = None


@dataclass(frozen=True)
class Peek:
    """``decide`` with ``commit=False``: what ``try_acquire`` would answer, nothing charged."""

    rule: int
    key: int
    cost: int


@dataclass(frozen=True)
class Charge:
    """Charge ``cost`` without a check (not for concurrency rules): the key may go into debt."""

    rule: int
    key: int
    cost: int


@dataclass(frozen=True)
class Refund:
    """Give back ``cost`` (not for concurrency rules: they release leases)."""

    rule: int
    key: int
    cost: int


@dataclass(frozen=True)
class Release:
    """Release the ``lease``-th lease granted on (rule, key), modulo their number; an unknown
    lease id when none was granted (a no-op on every store)."""

    rule: int
    key: int
    lease: int


@dataclass(frozen=True)
class Reset:
    rule: int
    key: int


@dataclass(frozen=True)
class Batch:
    """``decide_many`` over (rule, key, cost) items: every item charged, or none."""

    items: tuple[tuple[int, int, int], ...]


Op = Advance | Acquire | Peek | Charge | Refund | Release | Reset | Batch


@dataclass(frozen=True)
class Trace:
    """Rules (with ``names[i]`` the name of rule i: rules sharing a name and algorithm are one
    rule whose limits changed, as a quota changes them), keys, a start and the operations."""

    rules: tuple[RuleSpec, ...]
    keys: int
    start: int
    ops: tuple[Op, ...]
    names: tuple[int, ...] = ()


# --------------------------------------------------------------------------- strategies

_COUNTS = st.one_of(st.integers(1, 10), st.integers(1, 10), st.integers(1, 10), st.integers(100, 1000), st.just(2**20))
"""Mostly small; sometimes large, up to 2**20 (an emission interval of a 2**20th of a µs
scale: stores must keep their times relative, ``now * d`` is far past 2**53)."""
_PERIODS_US = st.one_of(
    st.sampled_from([1, 2, 3, 7, 1_000, 100_000, 1_000_000, 1_100_000, 3_000_000, 7_000_000, 60_000_000, 600_000_000]),
    st.integers(1, 5_000),
    st.integers(1, 10_000_000),
)
"""From 1 µs (fractional emission intervals such as 7/3 µs) to ten minutes, round and not."""

STARTS = st.one_of(
    st.sampled_from([0, 1, 1_000_000]),
    st.integers(0, 10**7),
    st.integers(EPOCH_US, EPOCH_US + 10**12),
    st.integers(EPOCH_US, EPOCH_US + 10**12),
    st.integers(2**52, 2**53 - 2**43),
)
"""Small times, realistic epoch microseconds (weighted twice), and the far future where
``now * d`` no longer fits a double's 53 bits (stores must keep times relative)."""


@st.composite
def rule_specs(draw: st.DrawFn, algorithm: str | None = None) -> RuleSpec:
    """A rule of ``algorithm`` (any, when None) with one to three limits, mostly small."""
    name = algorithm if algorithm is not None else draw(st.sampled_from(ALGORITHM_NAMES))
    limits = []
    for _ in range(draw(st.integers(1, 3))):
        count, period_us = draw(_COUNTS), draw(_PERIODS_US)
        burst = draw(st.none() | st.integers(1, 10)) if name in BURSTY else None
        limits.append(Limit.from_us(count, period_us, burst))
    return RuleSpec(name, tuple(limits))


def _steps(rules: Sequence[RuleSpec]) -> st.SearchStrategy[int]:
    periods = sorted({limit.period_us for spec in rules for limit in spec.limits})
    around = st.one_of(*(st.integers(max(0, p - 2), p + 2) for p in periods))
    within = st.one_of(*(st.integers(0, 2 * p) for p in periods))
    back = st.one_of(st.integers(1, 5_000_000), *(st.integers(1, p) for p in periods)).map(lambda us: -us)
    return st.one_of(
        st.just(0),
        st.just(1),
        st.integers(2, 1_000),
        around,
        within,
        st.integers(1, 10).map(lambda hours: hours * HOUR_US),
        back,
    )


def _costs(spec: RuleSpec) -> st.SearchStrategy[int]:
    """Mostly 1; else 0 to one more than the largest capacity (refused with retry -1)."""
    return st.one_of(st.just(1), st.integers(0, spec.capacity + 1))


def charge_costs(spec: RuleSpec) -> st.SearchStrategy[int]:
    """Mostly 1; else 0 to past three capacities (deeper than the deepest debt)."""
    return st.one_of(st.just(1), st.integers(0, 3 * spec.capacity + 1))


def _max_waits(spec: RuleSpec) -> st.SearchStrategy[int | None]:
    longest = max(limit.period_us for limit in spec.limits)
    return st.one_of(st.none(), st.just(0), st.integers(0, 3 * longest), st.just(UNBOUNDED_WAIT))


def _operations(rules: tuple[RuleSpec, ...], keys: int) -> st.SearchStrategy[Op]:
    rule_index = st.integers(0, len(rules) - 1)
    key_index = st.integers(0, keys - 1)

    @st.composite
    def acquire(draw: st.DrawFn) -> Acquire:
        i = draw(rule_index)
        spec = rules[i]
        cost = draw(_costs(spec))
        max_wait = draw(_max_waits(spec)) if spec.algorithm in RESERVING else None
        return Acquire(i, draw(key_index), cost, max_wait)

    @st.composite
    def peek(draw: st.DrawFn) -> Peek:
        i = draw(rule_index)
        return Peek(i, draw(key_index), draw(_costs(rules[i])))

    @st.composite
    def charge(draw: st.DrawFn) -> Charge | Peek:
        i = draw(rule_index)
        if rules[i].algorithm in LEASING:
            return Peek(i, draw(key_index), draw(_costs(rules[i])))
        return Charge(i, draw(key_index), draw(charge_costs(rules[i])))

    @st.composite
    def give_back(draw: st.DrawFn) -> Refund | Release:
        i = draw(rule_index)
        if rules[i].algorithm in LEASING:
            return Release(i, draw(key_index), draw(st.integers(0, 7)))
        return Refund(i, draw(key_index), draw(_costs(rules[i])))

    @st.composite
    def item(draw: st.DrawFn) -> tuple[int, int, int]:
        i = draw(rule_index)
        return i, draw(key_index), draw(_costs(rules[i]))

    advance = _steps(rules).map(Advance)
    reset = st.builds(Reset, rule_index, key_index)
    batch = st.lists(item(), min_size=1, max_size=3).map(lambda items: Batch(tuple(items)))
    return st.one_of(advance, advance, acquire(), acquire(), acquire(), peek(), charge(), give_back(), reset, batch)


@st.composite
def traces(draw: st.DrawFn, algorithm: str | None = None, max_ops: int = 30) -> Trace:
    """A trace over one to three rules of ``algorithm`` (mixed algorithms when None)."""
    rules = tuple(draw(rule_specs(algorithm)) for _ in range(draw(st.integers(1, 3))))
    names = tuple(draw(st.integers(0, 2)) if i else 0 for i in range(len(rules)))
    keys = draw(st.integers(1, 3))
    start = draw(STARTS)
    ops = draw(st.lists(_operations(rules, keys), min_size=1, max_size=max_ops))
    return Trace(rules, keys, start, tuple(ops), names)


# --------------------------------------------------------------------------- the reference


class Reference:
    """The truth: each (rule, key)'s possible states, decided by the pure algorithms.

    ``decide`` is ``Algorithm.decide`` (the generic reference, not the compiled one-limit
    decider the memory store runs); batches are decided as ``MemoryStore.decide_many``
    does: in order, each item seeing the ones before it, committed only when every item
    is admitted; refunds are ``Algorithm.refund``.

    A store may forget a state once it is whole again (Redis deletes it, the memory store
    drops idle generations, PostgreSQL sweeps rows). A whole state and no state decide
    alike going forward, but not always after the clock steps back (a whole fixed window
    still names the newer window; a full token bucket its later refill time). So each key
    holds its candidate states: the state as the algorithm leaves it, and also "forgotten"
    (None) once that state has been whole at some time the store has seen. A store's
    answer must equal the decision of one candidate; the candidates that gave it live on.
    A store that forgets a state before it is whole matches none.
    """

    MAX_CANDIDATES = 8

    def __init__(self) -> None:
        self.candidates: dict[tuple[str, str], list[tuple[Any, int]]] = {}
        """slot -> [(state, the time from which it is whole)]; no entry: [(None, 0)]."""
        self.latest = 0

    def _options(self, slot: tuple[str, str]) -> list[Any]:
        """The states the store may hold for ``slot`` now."""
        options: list[Any] = []
        for state, whole_at in self.candidates.get(slot, [(None, 0)]):
            for option in (state, None) if whole_at <= self.latest else (state,):
                if not any(option == o for o in options):
                    options.append(option)
        return options

    def _keep(self, plan: Plan, slot: tuple[str, str], pairs: Sequence[tuple[Any, Any]], now: int) -> None:
        """The candidates after an op: ``pairs`` of (state before, state after)."""
        old_whole = {id(s): w for s, w in self.candidates.get(slot, [(None, 0)])}
        kept: list[tuple[Any, int]] = []
        for before, after in pairs:
            if any(after == s for s, _ in kept):
                continue
            if after is None:
                whole_at = 0
            elif after == before and id(before) in old_whole:
                whole_at = old_whole[id(before)]
            else:
                _, probe = plan.algorithm.decide(plan, after, now, 0, None, None)
                whole_at = now + max(probe.reset_us)
            kept.append((after, whole_at))
        if len(kept) > self.MAX_CANDIDATES:
            raise RuntimeError(f"more than {self.MAX_CANDIDATES} candidate states for {slot}: {kept!r}")
        self.candidates[slot] = kept

    def decide(
        self,
        plan: Plan,
        key: str,
        cost: int,
        max_wait: int | None,
        lease_id: str | None,
        now: int,
        commit: bool,
        answer: Any,
        charge: bool = False,
    ) -> list[Decision]:
        """The reference decisions the store's ``answer`` is checked against: [] when it
        matched one (and the candidates are narrowed to those that give it), else every
        decision the reference allows. With ``charge``: a charge without a check
        (``Algorithm.charge``)."""
        slot = (plan.table, key)
        outcomes = []
        for state in self._options(slot):
            if charge:
                new, decision = plan.algorithm.charge(plan, state, now, cost)
            else:
                new, decision = plan.algorithm.decide(plan, state, now, cost, max_wait, lease_id)
            outcomes.append((state, new, decision))
        matching = [(state, new) for state, new, decision in outcomes if same(answer, decision)]
        if not matching:
            return _unique([decision for _, _, decision in outcomes])
        self._keep(plan, slot, [(s, n) if commit else (s, s) for s, n in matching], now)
        return []

    def decide_many(
        self, items: Sequence[tuple[Plan, str, int, str | None]], now: int, answer: Any
    ) -> list[tuple[Decision, ...]]:
        """``decide`` for a batch: every combination of the keys' candidate states."""
        slots: dict[tuple[str, str], Plan] = {}
        for plan, key, _, _ in items:
            slots[(plan.table, key)] = plan
        order = list(slots)
        outcomes = []
        for combo in itertools.product(*(self._options(slot) for slot in order)):
            start = dict(zip(order, combo, strict=True))
            pending = dict(start)
            decisions = []
            for plan, key, cost, lease_id in items:
                slot = (plan.table, key)
                pending[slot], decision = plan.algorithm.decide(plan, pending[slot], now, cost, None, lease_id)
                decisions.append(decision)
            outcomes.append((start, pending, tuple(decisions)))
        matching = [(start, pending, ds) for start, pending, ds in outcomes if same(answer, ds)]
        if not matching:
            return _unique([ds for _, _, ds in outcomes])
        admitted = all(d.allowed for d in matching[0][2])
        for slot in order:
            pairs = [(start[slot], pending[slot] if admitted else start[slot]) for start, pending, _ in matching]
            self._keep(slots[slot], slot, pairs, now)
        return []

    def refund(self, plan: Plan, key: str, cost: int, lease_id: str | None, now: int) -> None:
        slot = (plan.table, key)
        pairs = [
            (s, None if s is None else plan.algorithm.refund(plan, s, now, cost, lease_id)) for s in self._options(slot)
        ]
        self._keep(plan, slot, pairs, now)

    def reset(self, plan: Plan, key: str) -> None:
        self.candidates.pop((plan.table, key), None)


def same(got: Any, want: Any) -> bool:
    """Equal field by field, with the same types (a store answering 3.0 for 3 is wrong too)."""
    return bool(got == want) and _shape(got) == _shape(want)


def _unique(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if not any(v == o for o in out):
            out.append(v)
    return out


# --------------------------------------------------------------------------- the session

Call = Callable[..., Any]
"""``call(method, *args)``: run one method of the store under test (awaited for async stores)."""


class Disagreement(AssertionError):
    """A store decided differently from the reference."""


def _shape(value: Any) -> Any:
    """The types inside a decision field (a store answering 3.0 for 3 is wrong too)."""
    if isinstance(value, tuple) and not isinstance(value, Limit):
        return tuple(_shape(v) for v in value)
    return type(value).__name__


def _raw(value: Any) -> str:
    """Every field of a decision (or of a batch of them), not the friendly repr."""
    if isinstance(value, Decision):
        return tuple.__repr__(value)
    if isinstance(value, tuple):
        return "(" + ", ".join(_raw(v) for v in value) + ")"
    return repr(value)


def _explain(got: Any, want: Any) -> str:
    if not (isinstance(got, tuple) and isinstance(want, tuple)):
        return f"store {got!r}, reference {want!r}"
    lines = []
    for name, g, w in zip(FIELDS, got, want, strict=False):
        if g != w or _shape(g) != _shape(w):
            lines.append(f"    {name}: store {g!r}, reference {w!r}")
    if len(got) != len(want):
        lines.append(f"    length: store {len(got)}, reference {len(want)}")
    return "\n".join(lines)


class Session:
    """One trace replayed on a store and on the reference, side by side.

    ``call`` runs a store method (the thin sync or async shell); ``tag`` makes the rule
    names and keys unique to this session, so sessions sharing a store never meet.
    ``names[i]`` names rule i (default: its index); rules of one name and algorithm share
    a key's state when their limits are of the same scale (``Plan.table``).
    """

    def __init__(
        self,
        call: Call,
        rules: tuple[RuleSpec, ...],
        keys: int,
        start: int,
        tag: str,
        names: Sequence[int] = (),
    ) -> None:
        self.call = call
        self.specs = rules
        self.rules = tuple(spec.build(f"{tag}.r{names[i] if i < len(names) else i}") for i, spec in enumerate(rules))
        self.keys = tuple(f"{tag}.k{j}" for j in range(keys))
        self.tag = tag
        self.now = start
        self.reference = Reference()
        self.reference.latest = start
        self.leases: dict[tuple[int, int], list[str]] = {}
        self.history: list[str] = []
        self.count = 0
        self.broken = False

    def run(self, ops: Sequence[Op]) -> None:
        for op in ops:
            self.apply(op)
        self.finish()

    def apply(self, op: Op) -> None:
        self.count += 1
        self.history.append(f"#{self.count} {op!r} at now={self.now}")
        if isinstance(op, Advance):
            target = max(0, self.now + op.us)
            self.now = target
            self.reference.latest = max(self.reference.latest, target)
            self.history[-1] += f" -> now={target}"
        elif isinstance(op, Acquire):
            plan, key = self.rules[op.rule].plan, self.keys[op.key]
            lease = f"{self.tag}.lease{self.count}" if plan.leases else None
            got = self.call("decide", StoreOp.decide(plan, key, op.cost, op.max_wait, lease), self.now)
            self.compare(op, got, self.reference.decide(plan, key, op.cost, op.max_wait, lease, self.now, True, got))
            if got.lease_id is not None:
                self.leases.setdefault((op.rule, op.key), []).append(got.lease_id)
        elif isinstance(op, Peek):
            plan, key = self.rules[op.rule].plan, self.keys[op.key]
            got = self.call("decide", StoreOp.peek(plan, key, op.cost), self.now)
            self.compare(op, got, self.reference.decide(plan, key, op.cost, None, None, self.now, False, got))
        elif isinstance(op, Charge):
            plan, key = self.rules[op.rule].plan, self.keys[op.key]
            got = self.call("decide", StoreOp.charge(plan, key, op.cost), self.now)
            self.compare(op, got, self.reference.decide(plan, key, op.cost, None, None, self.now, True, got, True))
        elif isinstance(op, Refund):
            plan, key = self.rules[op.rule].plan, self.keys[op.key]
            self.reference.refund(plan, key, op.cost, None, self.now)
            self.call("refund", StoreOp.refund(plan, key, op.cost), self.now)
        elif isinstance(op, Release):
            plan, key = self.rules[op.rule].plan, self.keys[op.key]
            held = self.leases.get((op.rule, op.key))
            lease = held[op.lease % len(held)] if held else f"{self.tag}.unknown-lease"
            self.history[-1] += f" releases {lease!r}"
            self.reference.refund(plan, key, 0, lease, self.now)
            self.call("refund", StoreOp.refund(plan, key, 0, lease), self.now)
        elif isinstance(op, Reset):
            plan, key = self.rules[op.rule].plan, self.keys[op.key]
            self.reference.reset(plan, key)
            self.call("reset", plan, key)
        else:
            items = []
            for n, (i, k, cost) in enumerate(op.items):
                plan = self.rules[i].plan
                items.append((plan, self.keys[k], cost, f"{self.tag}.lease{self.count}.{n}" if plan.leases else None))
            got_all = tuple(
                self.call("decide_many", [StoreOp.decide(p, k, c, None, le) for p, k, c, le in items], self.now)
            )
            self.compare(op, got_all, self.reference.decide_many(items, self.now, got_all))
            if all(d.allowed for d in got_all):
                for (i, k, _), d in zip(op.items, got_all, strict=True):
                    if d.lease_id is not None:
                        self.leases.setdefault((i, k), []).append(d.lease_id)

    def finish(self) -> None:
        """Peek every (rule, key) at the end: a state that drifted apart unseen shows here."""
        for i in range(len(self.rules)):
            for k in range(len(self.keys)):
                self.apply(Peek(i, k, 1))

    def compare(self, op: Op, got: Any, wanted: list[Any]) -> None:
        """Fail unless the reference accepted the store's answer (``wanted`` empty)."""
        if not wanted:
            return
        self.broken = True
        want = wanted[0]
        if isinstance(op, Batch):
            detail = "\n".join(
                f"  item {n}:\n{_explain(g, w)}" for n, (g, w) in enumerate(zip(got, want, strict=False)) if g != w
            ) or _explain(got, want)
        else:
            detail = _explain(got, want)
        rules = ", ".join(f"{self.rules[i].name} = {spec!r}" for i, spec in enumerate(self.specs))
        raise Disagreement(
            f"the store disagrees with the reference at op #{self.count} {op!r}, now={self.now} ({rules}):\n"
            f"{detail}\n  store:     {_raw(got)}\n"
            f"  reference: {_raw(want)}\n"
            + "".join(f"  or, had the store forgotten a whole state: {_raw(w)}\n" for w in wanted[1:])
            + "  ops so far:\n    "
            + "\n    ".join(self.history)
        )


def examples(default: int) -> int:
    """Examples per test: ``RATEKEEPER_CONFORMANCE_EXAMPLES`` scales a deep run."""
    raw = os.environ.get("RATEKEEPER_CONFORMANCE_EXAMPLES")
    if not raw:
        return default
    value = int(raw)
    if value < 1:
        raise ValueError(f"RATEKEEPER_CONFORMANCE_EXAMPLES must be a positive integer, got {raw!r}")
    return value
