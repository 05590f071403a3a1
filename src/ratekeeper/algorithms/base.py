"""What every algorithm provides, and the plan it precomputes for a rule's limits.

An algorithm is a set of pure functions over integer microseconds: no I/O, no clock, no
locks. For each plan it compiles one decider (``Plan.decide``, the plan's constants
bound), and ``decide(plan, state, now, cost, max_wait, lease_id)`` calls it: it returns
the new state and the ``Decision``; the state it is given is never mutated, so the same
call with the same input always gives the same answer. ``None`` is the state of a key
that was never used (or is whole again). These functions are the reference that every
store must equal, decision by decision, and the engine of the memory store. Most
algorithms write their decision once, for one limit (``per_limit``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from ratekeeper.decision import INFINITE
from ratekeeper.errors import InvalidLimit, InvalidRequest

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.limit import Limit

__all__ = ["UNBOUNDED_WAIT", "Algorithm", "Decider", "Plan", "State", "ceil_div", "debt_charge", "later"]

State = Any
"""An algorithm's private state for one key: ints and tuples of ints (floats only where
the algorithm is approximate), never mutated in place."""

Decider = Callable[[State, int, int, "int | None", "str | None"], "tuple[State, Decision]"]

UNBOUNDED_WAIT = 1 << 62
"""``max_wait`` meaning "wait as long as it takes" (``acquire`` without a timeout)."""

MAX_EXACT = 1 << 53
"""Largest integer that Lua numbers and doubles hold exactly: the bound for the scaled
arithmetic of the bucket algorithms, so every store can repeat it bit for bit."""


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers with ``b > 0``."""
    return -(-a // b)


def debt_charge(cost: int, left: int, deepest: int) -> int:
    """What a charge of ``cost`` takes from a limit with ``left`` remaining (below 0 in
    debt): all of it, but never past ``-deepest`` (the limit's count, or its burst)."""
    room = deepest + left
    return cost if cost <= room else room if room > 0 else 0


def later(a: int, b: int) -> bool:
    """Whether retry time ``a`` is later than ``b`` (``INFINITE`` is latest)."""
    if a == INFINITE:
        return b != INFINITE
    return b != INFINITE and a > b


class Plan:
    """What an algorithm precomputes for one rule's limits: reused by every decision."""

    __slots__ = ("algorithm", "decide", "derived", "horizon", "leases", "limits", "name", "specs", "table")

    def __init__(self, algorithm: Algorithm, name: str, limits: tuple[Limit, ...], specs: tuple[Any, ...]) -> None:
        self.algorithm = algorithm
        self.name = name
        self.limits = limits
        self.specs = specs
        self.leases = algorithm.uses_leases
        self.horizon = algorithm.horizon(self)
        # Where a store keeps this rule's state: a key whose limits change (a reload, a new
        # quota) keeps its state where it means the same under the new limits or records
        # the scale it was written at and is carried over (the bucket algorithms: carry.py),
        # and starts afresh where neither holds (see ``Algorithm.scale``).
        self.table = "\x1f".join([name, algorithm.name, *map(str, algorithm.scale(self))])
        self.decide: Decider = algorithm.compile(self)
        # What a store derives from this plan once (its wire fields, a statement's
        # parameters), kept here so that it is forgotten with the plan: a store-wide cache
        # keyed by plan would keep every plan of every rules reload alive.
        self.derived: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Plan({self.algorithm.name}, {self.name!r}, {[str(x) for x in self.limits]})"


class Algorithm(ABC):
    """One rate-limiting algorithm as pure functions over integer microseconds.

    An implementation guarantees: ``decide`` never mutates ``state``; a refused request
    returns a state that decides exactly as the input would (nothing charged); every
    limit of the plan is charged or none; ``retry_us`` is the earliest time at which
    the same cost would be admitted if nothing else happened (``INFINITE`` when it
    never can); ``reset_us`` per limit is the time until that limit is whole.
    """

    name: ClassVar[str]
    reserves: ClassVar[bool] = False
    """Whether ``acquire`` can reserve a future slot (``max_wait`` > 0) in one call."""
    uses_burst: ClassVar[bool] = False
    uses_leases: ClassVar[bool] = False

    def plan(self, name: str, limits: tuple[Limit, ...]) -> Plan:
        if not self.uses_burst:
            for limit in limits:
                if limit.burst is not None:
                    raise InvalidLimit(
                        f"rule {name!r}: burst applies to token_bucket, gcra and leaky_bucket, "
                        f"not to {self.name}; remove burst from {limit}"
                    )
        return Plan(self, name, limits, tuple(self.spec(name, limit) for limit in limits))

    def spec(self, name: str, limit: Limit) -> Any:
        """The numbers one limit needs, precomputed. The window algorithms': the count and
        the period (µs); the buckets override."""
        return limit.count, limit.period_us

    @abstractmethod
    def compile(self, plan: Plan) -> Decider:
        """The decider of ``plan``: ``(state, now, cost, max_wait, lease_id)`` -> (new state,
        decision), with the plan's constants bound. Built once per plan (``Plan.decide``)."""

    def decide(
        self, plan: Plan, state: State, now: int, cost: int, max_wait: int | None = None, lease_id: str | None = None
    ) -> tuple[State, Decision]:
        """Decide whether ``cost`` is admitted at ``now`` (µs); return (new state, decision)."""
        return plan.decide(state, now, cost, max_wait, lease_id)

    def charge(self, plan: Plan, state: State, now: int, cost: int) -> tuple[State, Decision]:
        """Charge ``cost`` at ``now`` without a check: (new state, the decision after the charge).

        A cost known only after the fact (a response's size, a stream's tokens) is charged
        whatever is left, so a key may go into debt: ``remaining`` below zero, and the key
        refused until time pays the debt back. The decision is admitted (the charge is
        made), with no retry and no delay, and each limit's ``remaining`` and ``reset_us``
        as they are after it. A debt is at most one limit deep: ``remaining`` never goes
        below minus the limit's count (its burst for the buckets, less for a bucket of
        nearly 2**53 units: ``bucket.deepest_debt``); what a charge would take beyond that
        is not recorded. So a key is refused for at most about two periods after any
        charge, and every store's arithmetic stays exact (no value grows beyond twice what
        an admission can write, nor past 2**53). An algorithm where a charge means nothing
        refuses it (``InvalidRequest``).
        """
        raise InvalidRequest(f"rule {plan.name!r}: {self.name} cannot charge without a check")

    @abstractmethod
    def refund(self, plan: Plan, state: State, now: int, cost: int, lease_id: str | None = None) -> State:
        """Give back ``cost`` charged earlier (never more than was charged and is still counted)."""

    def scale(self, plan: Plan) -> tuple[Any, ...]:
        """What the meaning of a stored state depends on besides the algorithm: states written
        under plans of equal scale are read alike. The window algorithms number windows by
        period, so: every period."""
        return tuple(limit.period_us for limit in plan.limits)

    def horizon(self, plan: Plan) -> int:
        """Microseconds after which the state written by any decision without a reservation
        (``max_wait`` unused) is whole again, whatever it was: stores expire idle keys by it.
        The window algorithms' longest period; the others override."""
        return max(limit.period_us for limit in plan.limits)

    def waiting_cannot_help(self, decision: Decision, max_wait: int) -> bool:
        """Whether a refusal under ``max_wait`` would stay a refusal however long the caller
        waits within ``max_wait`` (so ``acquire`` gives up at once instead of sleeping).

        A reservation (token bucket, GCRA) is refused only when its wait exceeds
        ``max_wait``, and waiting shrinks both equally.
        """
        return self.reserves
