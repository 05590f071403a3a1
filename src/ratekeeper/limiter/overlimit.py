"""The over-limit cache: a denial answered in this process until its ``retry_after`` has passed.

``Limiter(store, over_limit_cache=True)`` (or ``AsyncLimiter``) remembers, per rule and
key, the store's last denial: ``(cost, until)`` where ``until`` is the local time when
``retry_after`` runs out. Until then a ``try_acquire`` of that rule and key for the same
cost or more is refused here, without a store round trip, so a flood from one abusive
key costs the store nothing.

Why it never admits more than the store would: the cache only ever *refuses*. Why it
refuses no longer than the store would, except after a refund: the store answered that
``cost`` cannot be admitted for ``retry_after`` seconds, and with no refund, reset or
lease release in between, every algorithm keeps that promise (time is the only thing
that frees quota, and a larger cost needs at least as long). ``until`` is counted from
the moment the call was *sent*, so the local deadline falls no later than the store's
own. A refund, reset or release made through this limiter forgets the key's entry; one
made by another process is not seen, so there a key may be refused for at most the rest
of its ``retry_after`` although quota came back: the documented price of the cache.

A ``try_acquire_many`` of one item (a web request under one rule) is a ``try_acquire``
for the limiter, so the cache answers it too; larger batches always go to the store, and
remember their denials. Not cached: peeks, ``acquire``'s reservations (they may be admitted with a delay),
concurrency rules (a lease can be released early by anyone), a cost that no wait can
admit (``retry_after = inf``, already refused without state), and fallback decisions
(made without the store). The cache is bounded (``max_keys``; the oldest entry goes
first) and a hit reports the decision to the observer like any other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ratekeeper.decision import Decision
from ratekeeper.limiter.observer import Reports
from ratekeeper.op import DECIDE

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.clock import Clock
    from ratekeeper.limiter.observer import Observer
    from ratekeeper.op import Op

__all__ = ["DEFAULT_MAX_KEYS", "DenialCache"]

DEFAULT_MAX_KEYS = 100_000


class DenialCache:
    """The entries and their rules, shared by ``OverLimitCache`` and ``AsyncOverLimitCache``
    (``store_wrappers``).

    ``hits`` counts the calls answered here; ``stored`` the denials remembered.
    """

    __slots__ = ("clock", "entries", "hits", "max_keys", "reports", "stored")

    def __init__(self, clock: Clock, max_keys: int = DEFAULT_MAX_KEYS, observer: Observer | None = None) -> None:
        self.clock = clock
        self.max_keys = max_keys
        self.reports: Reports | None = None
        self.observer = observer
        self.entries: dict[tuple[Plan, str], tuple[int, int, int, Decision]] = {}
        self.hits = 0
        self.stored = 0

    @property
    def observer(self) -> Observer | None:
        """Told each hit (the limiter sets it after building the cache)."""
        return None if self.reports is None else self.reports.observer

    @observer.setter
    def observer(self, observer: Observer | None) -> None:
        self.reports = None if observer is None else Reports(observer)

    def lookup(self, op: Op) -> tuple[Decision | None, int]:
        """A denial for ``op`` if one is still in force, and the time (µs) to count from."""
        sent = self.clock.now_us()
        if op[0] is not DECIDE or op[4] is not None or op[5] is not None:
            return None, sent
        entry = self.entries.get((op[1], op[2]))
        if entry is None:
            return None, sent
        cost, until, stored_at, denial = entry
        if sent >= until:
            del self.entries[(op[1], op[2])]
            return None, sent
        if op[3] < cost:
            return None, sent
        self.hits += 1
        decision = _aged(denial, sent - stored_at)
        if self.reports is not None:
            self.reports.decided(decision, op[2])
        return decision, sent

    def remember(self, op: Op, decision: Decision, sent: int) -> None:
        """Keep ``decision`` when it is a denial the cache may repeat."""
        if decision[2] or decision[9] is not None or op[0] is not DECIDE or op[4] is not None or op[1].leases:
            return
        retry = decision[4]
        if retry <= 0 or retry >= _FOREVER:
            return
        key = (op[1], op[2])
        entries = self.entries
        if key not in entries and len(entries) >= self.max_keys:
            del entries[next(iter(entries))]
        entries[key] = (op[3], sent + retry, sent, decision)
        self.stored += 1

    def forget(self, plan: Plan, key: str) -> None:
        self.entries.pop((plan, key), None)


_FOREVER = 2**62
"""Retry times at or above this are the algorithms' 'never' (``retry_after = inf``)."""


def _aged(denial: Decision, elapsed: int) -> Decision:
    """``denial`` as it reads ``elapsed`` µs later: retry and reset times shortened."""
    fields = list(denial)
    fields[4] = max(0, denial[4] - elapsed)
    fields[7] = tuple(max(0, r - elapsed) for r in denial[7])
    return Decision(fields)
