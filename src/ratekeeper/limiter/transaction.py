"""One request's transaction, written once for the web integrations and the service.

A request names several rules (the middleware's matching rules, a ``checks`` batch of
``/v1/check``, the descriptors of an Envoy request). ``transaction(entries)`` decides them
as one transaction, without doing any I/O itself: it is a generator that yields the calls
to make (a ``Step``: calls that do not depend on each other, which an async driver runs
concurrently) and receives their answers, in the shape of ``limiter.flows``. ``run_transaction`` and ``drive``
(``drive_async`` and its generated twin ``drive``) run it with an ``AsyncLimiter`` or a
``Limiter``.

The rule, for every caller:

1. entries that only look (``peek``: Envoy's ``hits_addend: 0``) are peeked; when an
   enforced one would be refused, the request is refused and nothing is charged;
2. the enforced entries that charge go to ONE ``try_acquire_many``: all are charged or
   none;
3. the shadow entries are charged (each on its own: a shadow rule never refuses and never
   makes another refuse) only when the request was admitted; when it was refused they are
   peeked, so what they would have said is still reported, and a refused request has
   charged nothing anywhere.

Shadow rules measure what a rule would do to the traffic that really goes through; a
refused request does not go through, so it is not counted against them (counting it
would make a shadow rule look tighter than it would be once enforced beside the others).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass

from ratekeeper.decision import BatchDecision, Decision
from ratekeeper.rule import Rule

__all__ = [
    "Acquire",
    "Call",
    "Entry",
    "Outcome",
    "Peek",
    "Step",
    "Transaction",
    "transaction",
]


@dataclass(frozen=True, slots=True)
class Entry:
    """One rule and key of a request: charge ``cost`` (or only look, when ``peek``)."""

    rule: Rule
    key: str
    cost: int = 1
    shadow: bool = False
    peek: bool = False


@dataclass(frozen=True, slots=True)
class Acquire:
    """``try_acquire_many(items)``: answered with a ``BatchDecision``."""

    items: tuple[tuple[Rule, str, int], ...]


@dataclass(frozen=True, slots=True)
class Peek:
    """``peek(rule, key, cost)``: answered with a ``Decision``."""

    rule: Rule
    key: str
    cost: int


Call = Acquire | Peek
Step = tuple[Call, ...]
"""Calls that do not depend on each other; answered in the same order."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """The verdict of one request and one decision per entry, in the entries' order."""

    allowed: bool
    entries: tuple[Entry, ...]
    decisions: tuple[Decision, ...]

    @property
    def enforced(self) -> tuple[tuple[Entry, Decision], ...]:
        """The (entry, decision) pairs of the rules that may refuse (what headers report)."""
        return tuple((e, d) for e, d in zip(self.entries, self.decisions, strict=True) if not e.shadow)

    @property
    def charged(self) -> tuple[tuple[Entry, Decision], ...]:
        """The (entry, decision) pairs that were charged (to give back, or leases to release)."""
        return tuple(
            (e, d)
            for e, d in zip(self.entries, self.decisions, strict=True)
            if self.allowed and not e.peek and d.allowed
        )


Transaction = Generator[Step, Sequence[BatchDecision | Decision], Outcome]


def transaction(entries: Sequence[Entry]) -> Transaction:
    """Decide ``entries`` as one transaction (see the module docstring)."""
    entries = tuple(entries)
    decisions: list[Decision | None] = [None] * len(entries)
    allowed = True
    looks = [i for i, e in enumerate(entries) if e.peek and not e.shadow]
    charges = [i for i, e in enumerate(entries) if not e.peek and not e.shadow]
    if looks:
        answers = yield tuple(Peek(entries[i].rule, entries[i].key, max(entries[i].cost, 1)) for i in looks)
        for i, answer in zip(looks, answers, strict=True):
            assert isinstance(answer, Decision)
            decisions[i] = answer
            allowed = allowed and answer.allowed
    if charges:
        if allowed:
            batch = Acquire(tuple((entries[i].rule, entries[i].key, entries[i].cost) for i in charges))
            (answer,) = yield (batch,)
            assert isinstance(answer, BatchDecision)
            allowed = answer.allowed
            for i, d in zip(charges, answer.decisions, strict=True):
                decisions[i] = d
        else:
            answers = yield tuple(Peek(entries[i].rule, entries[i].key, entries[i].cost) for i in charges)
            for i, answer in zip(charges, answers, strict=True):
                assert isinstance(answer, Decision)
                decisions[i] = answer
    shadows = [i for i, e in enumerate(entries) if e.shadow]
    if shadows:
        calls: list[Call] = []
        for i in shadows:
            e = entries[i]
            if e.peek or not allowed:
                calls.append(Peek(e.rule, e.key, max(e.cost, 1)))
            else:
                calls.append(Acquire(((e.rule, e.key, e.cost),)))
        answers = yield tuple(calls)
        for i, answer in zip(shadows, answers, strict=True):
            decisions[i] = answer.decisions[0] if isinstance(answer, BatchDecision) else answer
    done = tuple(d for d in decisions if d is not None)
    assert len(done) == len(entries)
    return Outcome(allowed, entries, done)
