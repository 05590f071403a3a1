"""What the JSON API decides for one request: its transaction, and the headers of its answer.

A ``/v1/check`` request (one check, or a ``checks`` batch) is decided by the same
transaction as a request through the web middleware (``ratekeeper.limiter.transaction``):
the enforced checks all or nothing, the shadow checks charged only when the request was
admitted (peeked when it was refused, so a refused request charges nothing). Its headers
come from the one headers function (``ratekeeper.web.headers.rate_limit_headers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter

from ratekeeper.limiter.drive_async import run_transaction
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.limiter.transaction import Entry, Outcome
from ratekeeper.web.headers import rate_limit_headers

__all__ = ["Item", "Outcome", "answer_headers", "decide_together"]

Item = Entry
"""One rule and key of a request (``ratekeeper.limiter.transaction.Entry``)."""


async def decide_together(limiter: AsyncLimiter, items: Sequence[Item]) -> Outcome:
    """Decide ``items`` as one transaction (``ratekeeper.limiter.transaction``).

    ``StoreError`` propagates when the limiter's failure policy is ``raise``; otherwise
    the policy's decisions (``fallback`` set) are returned like any other.
    """
    start = perf_counter()
    if len(items) == 1 and not items[0].shadow and not items[0].peek:
        # One enforced check is the transaction's one ``try_acquire``: called directly, the
        # request skips the transaction's generator and the one-item batch around it.
        item = items[0]
        decision = await limiter.try_acquire(item.rule, item.key, item.cost)
        outcome = Outcome(decision.allowed, (item,), (decision,))
    else:
        outcome = await run_transaction(limiter, items)
    # The observer is the service's Metrics (a limiter of code may have another kind).
    timed = getattr(limiter.observer, "decision_time", None)
    if timed is not None:
        timed(perf_counter() - start, outcome.allowed)
    return outcome


def answer_headers(outcome: Outcome) -> list[tuple[str, str]]:
    """The rate-limit headers of the answer to ``outcome``'s request."""
    return rate_limit_headers([(e.rule, d) for e, d in outcome.enforced], allowed=outcome.allowed)
