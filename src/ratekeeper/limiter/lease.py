"""Leases of concurrency rules as context managers (sync and async)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ratekeeper.errors import LeaseError, RateLimitExceeded

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.limiter.async_limiter import AsyncLimiter
    from ratekeeper.limiter.limiter import Limiter
    from ratekeeper.rule import Rule

__all__ = ["AsyncLease", "Lease"]


class _LeaseBase:
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

    def _check_free(self) -> None:
        if self.decision is not None and not self.released:
            raise LeaseError("this lease is already held: leave its block before entering it again")

    def _granted(self, decision: Decision) -> None:
        if not decision.allowed:
            raise RateLimitExceeded(decision, cost=self.cost)
        self.decision = decision
        self.released = False

    def __repr__(self) -> str:
        if self.decision is None:
            state = "not acquired"
        elif self.decision.lease_id is None:
            state = "unlimited key"
        else:
            state = f"{'released' if self.released else 'held'} id={self.decision.lease_id!r}"
        cost = f" cost={self.cost}" if self.cost != 1 else ""
        return f"<{type(self).__name__} {self.rule.name!r} key={self.key!r}{cost}: {state}>"

    def _take_for_release(self) -> str | None:
        if self.decision is None or self.released or self.decision.lease_id is None:
            return None
        self.released = True
        return self.decision.lease_id


class Lease(_LeaseBase):
    """``with limiter.lease(rule, key) as lease:`` holds one slot of a concurrency rule.

    Entering waits up to ``timeout`` seconds (0: not at all) and raises
    ``RateLimitExceeded`` when no slot frees up; leaving releases the slot. A holder that
    dies without leaving frees its slot when the lease expires (the limit's period).
    """

    def __init__(self, limiter: Limiter, rule: Rule, key: str, cost: int, timeout: float | None) -> None:
        super().__init__(rule, key, cost, timeout)
        self._limiter = limiter

    def __enter__(self) -> Lease:
        self._check_free()
        if self.timeout == 0:
            self._granted(self._limiter.try_acquire(self.rule, self.key, self.cost))
        else:
            self._granted(self._limiter.acquire(self.rule, self.key, self.cost, timeout=self.timeout))
        return self

    def release(self) -> None:
        lease_id = self._take_for_release()
        if lease_id is not None:
            self._limiter.release(self.rule, self.key, lease_id)

    def __exit__(self, *exc: object) -> None:
        self.release()


class AsyncLease(_LeaseBase):
    """``async with limiter.lease(rule, key) as lease:``; see ``Lease``."""

    def __init__(self, limiter: AsyncLimiter, rule: Rule, key: str, cost: int, timeout: float | None) -> None:
        super().__init__(rule, key, cost, timeout)
        self._limiter = limiter

    async def __aenter__(self) -> AsyncLease:
        self._check_free()
        if self.timeout == 0:
            self._granted(await self._limiter.try_acquire(self.rule, self.key, self.cost))
        else:
            self._granted(await self._limiter.acquire(self.rule, self.key, self.cost, timeout=self.timeout))
        return self

    async def release(self) -> None:
        lease_id = self._take_for_release()
        if lease_id is not None:
            await self._limiter.release(self.rule, self.key, lease_id)

    async def __aexit__(self, *exc: object) -> None:
        await self.release()
