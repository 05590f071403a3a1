"""``LeaseState``: what a lease context manager holds (its decision, whether released), shared
by ``Lease`` and ``AsyncLease`` (``limiter_async.py``), which add only the calls."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ratekeeper.errors import LeaseError, RateLimitExceeded

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.rule import Rule

__all__ = ["LeaseState"]


class LeaseState:
    """One lease of ``rule`` and ``key``: not acquired, held, or released."""

    def __init__(self, rule: Rule, key: str, cost: int, timeout: float | None) -> None:
        self.rule = rule
        self.key = key
        self.cost = cost
        self.timeout = timeout
        self.decision: Decision | None = None
        self.released = False

    @property
    def id(self) -> str:
        if self.decision is None or self.decision.lease_id is None:
            raise LeaseError("this lease has not been acquired")
        return self.decision.lease_id

    def check_free(self) -> None:
        """Refuse to enter a lease that is held (its block has not been left)."""
        if self.decision is not None and not self.released:
            raise LeaseError("this lease is already held: leave its block before entering it again")

    def granted(self, decision: Decision) -> None:
        """Hold the lease ``decision`` granted, or raise ``RateLimitExceeded`` if it refused."""
        if not decision.allowed:
            raise RateLimitExceeded(decision, cost=self.cost)
        self.decision = decision
        self.released = False

    def take_for_release(self) -> str | None:
        """The id to release, once (None: nothing held, or already released)."""
        if self.decision is None or self.released or self.decision.lease_id is None:
            return None
        self.released = True
        return self.decision.lease_id

    def __repr__(self) -> str:
        if self.decision is None:
            state = "not acquired"
        elif self.decision.lease_id is None:
            state = "unlimited key"
        else:
            state = f"{'released' if self.released else 'held'} id={self.decision.lease_id!r}"
        cost = f" cost={self.cost}" if self.cost != 1 else ""
        return f"<{type(self).__name__} {self.rule.name!r} key={self.key!r}{cost}: {state}>"
