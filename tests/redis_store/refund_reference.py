"""The reference of a refund as the stores apply it (tests' helper).

A refund that leaves a state whole forgets it, in every store (``MemoryStore.refund``,
main.lua, the conformance suite's ``Reference.refund``): a whole state could otherwise
still remember a newer window or refill time after the clock stepped back.
"""

from __future__ import annotations

from typing import Any

__all__ = ["refund_as_stores", "refunded_as_stores"]


def refund_as_stores(plan: Any, state: Any, now: int, cost: int, lease_id: str | None = None) -> Any:
    """``plan.algorithm.refund``, then None when the refunded state is whole."""
    if state is None:
        return None
    new = plan.algorithm.refund(plan, state, now, cost, lease_id)
    _, probe = plan.algorithm.decide(plan, new, now, 0, None, None)
    return None if max(probe.reset_us) <= 0 else new


def refunded_as_stores(plan: Any, state: Any, now: int, cost: int, lease_id: str | None = None) -> bool:
    """What a store's refund says: False for a release of a lease not held (live) under
    this key, else True."""
    if not plan.leases:
        return True
    if state is None:
        return False
    new = plan.algorithm.refund(plan, state, now, cost, lease_id)
    _, before = plan.algorithm.decide(plan, state, now, 0, None, None)
    _, after = plan.algorithm.decide(plan, new, now, 0, None, None)
    return bool(before.remaining_each != after.remaining_each)
