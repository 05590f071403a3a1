"""``Decision``: the answer to one request, with per-limit statistics."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ratekeeper.limit import Limit

__all__ = ["INFINITE", "UNLIMITED_REMAINING", "BatchDecision", "Decision", "LimitStats"]

INFINITE = -1
"""``retry_us`` value meaning the cost can never be admitted (it exceeds a capacity)."""

UNLIMITED_REMAINING = sys.maxsize
"""``remaining`` of a key that no limit applies to."""


@dataclass(frozen=True, slots=True)
class LimitStats:
    """The state of one limit of a rule after a decision.

    ``denied`` marks the limit named by ``Decision.denied_by`` (the refusing limit that
    frees up last); another limit may refuse as well, which its ``remaining`` shows.
    """

    limit: Limit
    remaining: int
    reset_after: float
    denied: bool


class Decision(tuple[Any, ...]):
    """Whether a request may proceed, and why.

    Truthy when allowed. Durations are float seconds; the raw integer microseconds that
    every store returns are kept too (``retry_us``, ``delay_us``, ``reset_us``), and two
    decisions are equal when all of those are equal, which is what the conformance suite
    compares.

    - ``remaining``: what the tightest limit still admits.
    - ``retry_after``: seconds until this cost could be admitted (0 when allowed, ``inf``
      when the cost exceeds a limit's capacity).
    - ``reset_after``: seconds until the tightest limit is whole again.
    - ``delay``: seconds the caller must wait before proceeding even though it was
      admitted (leaky-bucket queueing and reservations made by ``acquire``); usually 0.
    - ``denied_by``: the ``Limit`` that refused, None when allowed.
    - ``limits``: one ``LimitStats`` per limit, in the rule's order.
    - ``lease_id``: for concurrency rules, the lease to release.
    - ``fallback``: the failure policy that answered when the store failed, else None.

    The layout is fixed: ten fields, always, in the order of ``FIELDS`` (a tuple, so
    the algorithms build one without a Python-level constructor). Read it by name;
    ``with_fallback`` and ``without_lease`` give changed copies.
    """

    __slots__ = ()

    FIELDS = (
        "rule",
        "rule_limits",
        "allowed",
        "denied_index",
        "retry_us",
        "delay_us",
        "remaining_each",
        "reset_us",
        "lease_id",
        "fallback",
    )

    @classmethod
    def make(
        cls,
        rule: str,
        limits: tuple[Limit, ...],
        allowed: bool,
        denied_index: int,
        retry_us: int,
        delay_us: int,
        remaining: tuple[int, ...],
        reset_us: tuple[int, ...],
        lease_id: str | None = None,
        fallback: str | None = None,
    ) -> Decision:
        return cls((rule, limits, allowed, denied_index, retry_us, delay_us, remaining, reset_us, lease_id, fallback))

    if TYPE_CHECKING:

        @property
        def rule(self) -> str: ...
        @property
        def rule_limits(self) -> tuple[Limit, ...]: ...
        @property
        def allowed(self) -> bool: ...
        @property
        def denied_index(self) -> int: ...
        @property
        def retry_us(self) -> int: ...
        @property
        def delay_us(self) -> int: ...
        @property
        def remaining_each(self) -> tuple[int, ...]: ...
        @property
        def reset_us(self) -> tuple[int, ...]: ...
        @property
        def lease_id(self) -> str | None: ...
        @property
        def fallback(self) -> str | None: ...

    else:
        # C-level getters: the stores and the web layer read these per request
        rule = property(itemgetter(0), doc="the rule's name")
        rule_limits = property(itemgetter(1), doc="the rule's limits (empty for an unlimited key)")
        allowed = property(itemgetter(2), doc="whether the request may proceed")
        denied_index = property(itemgetter(3), doc="the index of the refusing limit, -1 when allowed")
        retry_us = property(itemgetter(4), doc="µs until this cost could be admitted; INFINITE when never")
        delay_us = property(itemgetter(5), doc="µs to wait before proceeding though admitted")
        remaining_each = property(itemgetter(6), doc="what each limit still admits")
        reset_us = property(itemgetter(7), doc="µs until each limit is whole again")
        lease_id = property(itemgetter(8), doc="the lease to release (concurrency), else None")
        fallback = property(
            itemgetter(9),
            doc="the failure policy that answered because the store failed (allow, deny, local), else None",
        )

    def with_fallback(self, policy: str) -> Decision:
        """This decision, marked as answered by the failure policy ``policy``."""
        return Decision((*self[:9], policy))

    def without_lease(self) -> Decision:
        """This decision without its lease id (nothing was charged, so no lease is held)."""
        return Decision((*self[:8], None, self[9]))

    def __bool__(self) -> bool:
        return self[2]  # type: ignore[no-any-return]

    def _tightest(self) -> int:
        remaining: tuple[int, ...] = self[6]
        resets: tuple[int, ...] = self[7]
        if not remaining:
            return -1
        best = 0
        for i in range(1, len(remaining)):
            if remaining[i] < remaining[best] or (remaining[i] == remaining[best] and resets[i] > resets[best]):
                best = i
        return best

    @property
    def unlimited(self) -> bool:
        """True for a key that no limit applies to (a quota provider exempted it)."""
        return not self[1]

    @property
    def remaining(self) -> int:
        return min(self[6], default=UNLIMITED_REMAINING)

    @property
    def retry_after(self) -> float:
        us: int = self[4]
        return math.inf if us == INFINITE else us / 1_000_000

    @property
    def reset_after(self) -> float:
        i = self._tightest()
        resets: tuple[int, ...] = self[7]
        return 0.0 if i < 0 else resets[i] / 1_000_000

    @property
    def delay(self) -> float:
        return self[5] / 1_000_000  # type: ignore[no-any-return]

    @property
    def denied_by(self) -> Limit | None:
        i: int = self[3]
        return None if i < 0 else self[1][i]

    @property
    def limit(self) -> Limit | None:
        """The limit to report in headers: the one that refused, else the tightest."""
        i: int = self[3]
        if i < 0:
            i = self._tightest()
        return None if i < 0 else self[1][i]

    @property
    def limits(self) -> tuple[LimitStats, ...]:
        denied: int = self[3]
        return tuple(
            LimitStats(limit, self[6][i], self[7][i] / 1_000_000, i == denied) for i, limit in enumerate(self[1])
        )

    @classmethod
    def unlimited_for(cls, rule: str) -> Decision:
        """The decision for a key that no limit applies to."""
        return cls.make(rule, (), True, -1, 0, 0, (), ())

    def __repr__(self) -> str:
        state = "allowed" if self[2] else f"denied by {self.denied_by}"
        extra = f", delay={self.delay:.6f}" if self[5] else ""
        lease = f", lease_id={self[8]!r}" if self[8] else ""
        fallback = f", fallback={self[9]!r}" if self[9] else ""
        if not self[1]:  # a key no limit applies to (Decision.unlimited)
            return f"<Decision {self[0]!r} allowed: unlimited{fallback}>"
        return (
            f"<Decision {self[0]!r} {state}: remaining={self.remaining}, retry_after={self.retry_after:.6f}, "
            f"reset_after={self.reset_after:.6f}{extra}{lease}{fallback}>"
        )

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view (``inf`` becomes None; a key no limit applies to has
        ``"unlimited": true`` and ``"remaining": null``).

        Read from the fields directly (no ``LimitStats`` built): the service writes one
        per check, a hundred per batch.
        """
        rule, limits, allowed, denied, retry_us, delay_us, remaining, resets, lease_id, fallback = self
        doc: dict[str, Any] = {
            "rule": rule,
            "allowed": allowed,
            "remaining": min(remaining) if limits else None,
        }
        if not limits:
            doc["unlimited"] = True
        tightest = self._tightest()
        doc["retry_after"] = None if retry_us == INFINITE else retry_us / 1_000_000
        doc["reset_after"] = 0.0 if tightest < 0 else resets[tightest] / 1_000_000
        doc["delay"] = delay_us / 1_000_000
        doc["denied_by"] = None if denied < 0 else str(limits[denied])
        doc["limits"] = [
            {"limit": str(x), "remaining": remaining[i], "reset_after": resets[i] / 1_000_000, "denied": i == denied}
            for i, x in enumerate(limits)
        ]
        if lease_id:
            doc["lease_id"] = lease_id
        if fallback:
            doc["fallback"] = fallback
        return doc


class BatchDecision:
    """The answer of ``try_acquire_many``: truthy only when every item was admitted.

    When one item is refused nothing is charged; each entry still says whether its item
    would have been admitted after the items before it (the same key twice sees the first
    charge).
    """

    __slots__ = ("decisions",)

    def __init__(self, decisions: tuple[Decision, ...]) -> None:
        self.decisions = decisions

    @property
    def allowed(self) -> bool:
        return all(d[2] for d in self.decisions)

    def __bool__(self) -> bool:
        return self.allowed

    @property
    def denied(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if not d[2])

    @property
    def retry_after(self) -> float:
        return max((d.retry_after for d in self.denied), default=0.0)

    def __iter__(self) -> Iterator[Decision]:
        return iter(self.decisions)

    def __len__(self) -> int:
        return len(self.decisions)

    def __getitem__(self, index: int) -> Decision:
        return self.decisions[index]

    def __repr__(self) -> str:
        return f"<BatchDecision allowed={self.allowed} {list(self.decisions)!r}>"
