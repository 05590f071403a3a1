"""``AsyncRateLimitCore``: the web core of the asyncio integrations (ASGI, FastAPI, async
Django), deciding with an ``AsyncLimiter`` (options and API: ``ratekeeper.web.base``).

This module is the source of ``core.py`` (``RateLimitCore``, with a ``Limiter``, for
WSGI, Flask and sync Django): ``tools/unasync.py`` writes it, and a test fails when the
two differ. Edit this one, then run ``python tools/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from time import perf_counter

from ratekeeper.errors import RateKeeperError
from ratekeeper.limiter.drive_async import drive
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.web.base import BaseRateLimitCore
from ratekeeper.web.headers import UNINFORMED
from ratekeeper.web.request import EXEMPT, PASS, Charge, RequestView, Verdict
from ratekeeper.web.settle import ResponseRecord

__all__ = ["AsyncRateLimitCore", "RequestView", "Verdict"]


class AsyncRateLimitCore(BaseRateLimitCore[AsyncLimiter]):
    """Decides requests for one integration instance (see ``ratekeeper.web.base``)."""

    limiter_class = AsyncLimiter

    async def check(self, view: RequestView) -> Verdict:
        """Decide ``view``: its transaction, run by the limiter (``check_flow``); a request
        of one enforced rule is one ``try_acquire``, called without the transaction's steps."""
        timed = self._decision_time  # None without metrics: no clock read, no call
        start = perf_counter() if timed is not None else 0.0
        prepared = self.prepare(view)
        if isinstance(prepared, Verdict):
            # no rule limited it; one whose rules were all skipped is still timed
            if timed is not None and prepared is not EXEMPT and prepared is not PASS:
                timed(perf_counter() - start, prepared.allowed)
            return prepared
        enforced = prepared.enforced
        if len(enforced) == 1 and not prepared.shadow:  # ``Prepared.one``, inlined
            rule, key, cost = enforced[0]
            verdict = self.one_verdict(prepared, await self.limiter.try_acquire(rule.rule, key, cost))
        else:
            verdict = await drive(self.limiter, self.decision_flow(prepared))
        if timed is not None:
            timed(perf_counter() - start, verdict.allowed)
        return verdict

    async def finish(self, verdict: Verdict, status: int, response: ResponseRecord | None = None) -> None:
        """After the app answered ``status``: give back what ``releases`` says, and settle
        ``response`` (``response_record``'s, when the response ended) by ``response_cost``.
        With a record, only its first call does anything (exactly once)."""
        if response is not None and not response.claim():
            return
        releases, settled = self.finish_plan(verdict, status, response)
        try:
            await self.give_back(releases)
        except RateKeeperError:  # the response is on its way: never an error for the server
            self.give_back_failed(status)
        for charge, delta in settled:
            try:
                if delta > 0:
                    decision = await self.limiter.charge(charge.rule, charge.key, delta)
                    if decision.fallback in UNINFORMED:  # the store is down: the policy's answer, not applied
                        self.settle_failed(charge, delta)
                else:
                    await self.limiter.refund(charge.rule, charge.key, -delta)
            except Exception as exc:  # noqa: BLE001 - the response is sent; a store error must not reach the server
                self.settle_failed(charge, delta, exc)

    async def give_back(self, charges: Iterable[Charge]) -> None:
        """Refund ``charges`` (or release their leases)."""
        for c in charges:
            await self.limiter.refund(c.rule, c.key, c.cost, lease_id=c.lease_id)

    async def aclose(self) -> None:
        """Close the store of a limiter made from ``store=`` (one given as ``limiter=`` is the caller's)."""
        if self.owns_limiter:
            await self.limiter.aclose()
