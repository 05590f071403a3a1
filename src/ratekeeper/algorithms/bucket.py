"""What the bucket algorithms share: exact rational specs, a state carried to any scale.

The token bucket, GCRA and the leaky bucket meter cost at ``n/d`` µs per unit (reduced),
with a capacity (the burst, by default the count). Their states record the scale they
were written at, so a plan of other limits reads them by ``carry.carried``: plans with as
many limits share the keys' states.
"""

from __future__ import annotations

from math import gcd
from typing import TYPE_CHECKING, Any

from ratekeeper.algorithms.base import MAX_EXACT, Plan, ceil_div
from ratekeeper.algorithms.per_limit import PerLimit
from ratekeeper.errors import InvalidLimit

if TYPE_CHECKING:
    from ratekeeper.limit import Limit

__all__ = ["Bucket", "deepest_debt", "rational_spec"]


def rational_spec(name: str, limit: Limit) -> tuple[int, int, int]:
    """``(n, d, capacity)`` with ``n/d`` µs per unit of cost, reduced.

    Checked so that ``capacity * n`` stays below 2**53: every store then repeats the
    arithmetic exactly (Lua numbers are doubles).
    """
    g = gcd(limit.period_us, limit.count)
    n, d = limit.period_us // g, limit.count // g
    cap = limit.capacity
    if cap * n >= MAX_EXACT or d >= MAX_EXACT // 4:
        raise InvalidLimit(
            f"rule {name!r}: limit {limit} is too fine for exact arithmetic "
            f"(capacity x period / count must stay below 2**53 microseconds); "
            f"use a rounder count, a shorter period or a smaller burst"
        )
    return n, d, cap


def deepest_debt(n: int, cap: int, full: int) -> int:
    """The deepest debt, in units of cost, that a charge without a check may leave in a
    bucket of spec ``(n, _, cap, full)``: one capacity, but never so deep that the time
    until the bucket is whole (``full + debt * n`` units) reaches 2**53, which Lua's doubles
    would no longer hold exactly (only buckets of nearly 2**53 units are cut short)."""
    room = (MAX_EXACT - 1 - full) // n
    return cap if cap <= room else room


class Bucket(PerLimit):
    """A bucket algorithm: spec ``(n, d, capacity, full)`` per limit, with ``full`` the
    capacity in units of ``1/d`` µs (``capacity * n``)."""

    reserves = True
    uses_burst = True

    def spec(self, name: str, limit: Limit) -> tuple[int, int, int, int]:
        n, d, cap = rational_spec(name, limit)
        return n, d, cap, cap * n

    def scale(self, plan: Plan) -> tuple[Any, ...]:
        """A state records its own scale and is carried to any other: plans with as many
        limits share the keys' states."""
        return ("carried", len(plan.specs))

    def horizon(self, plan: Plan) -> int:
        """From empty to full: ``full / d`` µs per limit (a reservation may go further)."""
        return max(ceil_div(full, d) for _, d, _, full in plan.specs)
