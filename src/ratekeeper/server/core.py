"""What the service decides, whatever the transport: one transaction per request.

Both front ends (the JSON API of ``http_app.py`` and Envoy's gRPC / JSON protocol of
``envoy.py``) turn a request into ``Item``s and call ``decide_together``, so a request
that names several rules (a ``checks`` batch, several Envoy descriptors) is decided the
same way on every transport:

1. items that only look (``peek``: an Envoy descriptor with ``hits_addend`` 0) are
   peeked; when an enforced one would be refused, nothing is charged and the request is
   refused;
2. the enforced items that charge go to ``try_acquire_many``: all are charged or none;
3. only when those were admitted, the shadow items are charged one by one (a shadow rule
   decides and counts but never refuses, and never makes the others refuse); when the
   request was refused they are peeked instead, so a refused request charges nothing.

The verdict is ``allowed`` when every enforced item was admitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ratekeeper.decision import Decision
from ratekeeper.limiter.async_limiter import AsyncLimiter
from ratekeeper.rule import Rule

__all__ = ["Item", "Outcome", "decide_together"]


@dataclass(frozen=True, slots=True)
class Item:
    """One rule and key of a request: charge ``cost`` (or only look, when ``peek``)."""

    rule: Rule
    key: str
    cost: int = 1
    shadow: bool = False
    peek: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """The verdict of one request and one decision per item, in the items' order."""

    allowed: bool
    decisions: tuple[Decision, ...]


async def decide_together(limiter: AsyncLimiter, items: Sequence[Item]) -> Outcome:
    """Decide ``items`` as one transaction (see the module docstring).

    ``StoreError`` propagates when the limiter's failure policy is ``raise``; otherwise
    the policy's decisions (``fallback`` set) are returned like any other.
    """
    decisions: list[Decision | None] = [None] * len(items)
    allowed = True
    # 1. the enforced peeks
    for i, item in enumerate(items):
        if item.peek and not item.shadow:
            d = await limiter.peek(item.rule, item.key, max(item.cost, 1))
            decisions[i] = d
            allowed = allowed and d.allowed
    # 2. the enforced charges, all or nothing
    charged = [i for i, item in enumerate(items) if not item.peek and not item.shadow]
    if charged:
        if allowed:
            batch = await limiter.try_acquire_many([(items[i].rule, items[i].key, items[i].cost) for i in charged])
            allowed = batch.allowed
            for i, d in zip(charged, batch.decisions, strict=True):
                decisions[i] = d
        else:
            for i in charged:
                decisions[i] = await limiter.peek(items[i].rule, items[i].key, items[i].cost)
    # 3. the shadow items: charged only when the request goes through
    for i, item in enumerate(items):
        if not item.shadow:
            continue
        if item.peek or not allowed:
            decisions[i] = await limiter.peek(item.rule, item.key, max(item.cost, 1))
        else:
            decisions[i] = await limiter.try_acquire(item.rule, item.key, item.cost)
    return Outcome(allowed, tuple(d for d in decisions if d is not None))
