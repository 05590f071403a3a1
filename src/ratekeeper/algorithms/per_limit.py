"""Algorithms decided one limit at a time, whatever the number of limits of a rule.

Each of these algorithms writes its decision once, in ``compile_one``: the decider of one
limit, its constants bound. That decider is the whole of a one-limit rule's
``Plan.decide``; a rule of several limits asks each limit's decider and combines their
answers (``combined``) into one transaction, by the rules every algorithm keeps:

- admitted when every limit admits, and then charged to every limit; refused otherwise,
  with nothing charged anywhere;
- refused by the limit whose ``retry_us`` is latest (``INFINITE`` latest of all), the
  first of those on a tie; ``retry_us`` is that limit's;
- an admitted request waits as long as its longest ``delay_us`` (a reservation, a queue);
- ``remaining`` and ``reset_us`` are each limit's own: of the state written, or of the
  state as it was when refused.

The state of a key is either split, ``width`` fields per limit that no other limit reads
(flat: ``(*part_0, *part_1, ...)``; the window counters and the buckets), or shared by
every limit (``width`` 0: the sliding window log), whose limits' deciders then only look
and the admitted cost is recorded once (``charge``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from itertools import chain
from typing import TYPE_CHECKING, Any, ClassVar

from ratekeeper.algorithms.base import Algorithm, Decider, Plan, State, later
from ratekeeper.decision import Decision

if TYPE_CHECKING:
    from ratekeeper.limit import Limit

__all__ = ["Charge", "PerLimit", "combined"]

Charge = Callable[[State, int, int], State]
"""``(state, now, cost)`` -> the shared state with ``cost`` admitted at ``now``."""


class PerLimit(Algorithm):
    """An algorithm decided one limit at a time (see the module docstring)."""

    width: ClassVar[int]
    """Fields of the state per limit; 0 when every limit reads the whole state."""

    @abstractmethod
    def compile_one(self, name: str, limits: tuple[Limit, ...], spec: Any) -> Decider:
        """The decider of one limit with this ``spec``: its part of the state in and out,
        its decision reported for a rule ``name`` of these ``limits``."""

    def refund_one(self, spec: Any, part: State, now: int, cost: int) -> State:
        """One limit's part (not None) with ``cost`` given back (``width`` > 0; a shared
        state's algorithm overrides ``refund`` instead)."""
        raise NotImplementedError

    def charge_one(self, spec: Any, part: State, now: int, cost: int) -> tuple[State, int, int]:
        """One limit's part (None when unused) with ``cost`` charged without a check
        (``Algorithm.charge``): the new part (``part`` itself when nothing changed), and the
        limit's ``remaining`` (below 0 in debt) and ``reset_us`` after the charge (``width``
        > 0; a shared state's algorithm overrides ``charge`` instead)."""
        raise NotImplementedError

    def charge(self, plan: Plan, state: State, now: int, cost: int) -> tuple[State, Decision]:
        w = self.width
        parts: list[State] = []
        remaining: list[int] = []
        resets: list[int] = []
        changed = False
        for i, spec in enumerate(plan.specs):
            part = None if state is None else state[i * w : (i + 1) * w]
            new, left, reset = self.charge_one(spec, part, now, cost)
            changed = changed or new is not part
            parts.append(new)
            remaining.append(left)
            resets.append(reset)
        if changed:
            # Every part is there: an unused key (None) charges every limit or none (a cost
            # of 0), and a used key's state holds every limit's part.
            state = tuple(chain.from_iterable(parts))
        return state, Decision((plan.name, plan.limits, True, -1, 0, 0, tuple(remaining), tuple(resets), None, None))

    def refund(self, plan: Plan, state: State, now: int, cost: int, lease_id: str | None = None) -> State:
        if state is None:
            return None
        w = self.width
        parts = (self.refund_one(spec, state[i * w : (i + 1) * w], now, cost) for i, spec in enumerate(plan.specs))
        return tuple(chain.from_iterable(parts))

    def compile(self, plan: Plan) -> Decider:
        if len(plan.specs) == 1:
            return self.compile_one(plan.name, plan.limits, plan.specs[0])
        pairs = zip(plan.limits, plan.specs, strict=True)
        return combined(plan, tuple(self.compile_one(plan.name, (limit,), spec) for limit, spec in pairs), self.width)


def combined(plan: Plan, ones: tuple[Decider, ...], width: int, charge: Charge | None = None) -> Decider:
    """The decider of ``plan`` from the deciders of its limits, in order: each limit's
    ``width`` fields of the state, or (``width`` 0) the whole state for each and
    ``charge`` to record an admitted cost (see the module docstring)."""
    name, limits = plan.name, plan.limits
    spans = tuple((one, i * width, (i + 1) * width) for i, one in enumerate(ones))

    def decide(
        state: State, now: int, cost: int, max_wait: int | None = None, lease_id: str | None = None
    ) -> tuple[State, Decision]:
        denied = -1
        retry = delay = 0
        parts: list[State] = []
        answers: list[Decision] = []
        for i, (one, a, b) in enumerate(spans):
            part = state if state is None or not width else state[a:b]
            part, answer = one(part, now, cost, max_wait, lease_id)
            parts.append(part)
            answers.append(answer)
            if not answer[2]:  # refused
                if denied < 0 or later(answer[4], retry):
                    denied, retry = i, answer[4]
            elif answer[5] > delay:
                delay = answer[5]
        if denied < 0:
            if cost:
                state = charge(state, now, cost) if charge else tuple(chain.from_iterable(parts))
        else:
            # Nothing is charged: a limit that would have admitted tells of its state as it
            # is, which its decider gives for cost 0 (a cost of 0 charges nothing).
            delay = 0
            for i, (one, a, b) in enumerate(spans):
                if answers[i][2] and cost:
                    answers[i] = one(state if state is None or not width else state[a:b], now, 0, None, None)[1]
        remaining = tuple([answer[6][0] for answer in answers])
        resets = tuple([answer[7][0] for answer in answers])
        return state, Decision((name, limits, denied < 0, denied, retry, delay, remaining, resets, None, None))

    return decide
