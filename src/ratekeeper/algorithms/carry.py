"""How a bucket's state is read under limits other than those it was written under.

A key's state under the token bucket, GCRA and the leaky bucket records the scale it was
written at (``n``, ``d`` and the capacity of each limit). Read under a plan of another
scale (a reloaded rule, a quota's new answer, the quota fetched after the failsafe), what
was consumed stays consumed: the cost the old limit still counts, in whole units (a unit
partly refilled still counts), is charged to the new limit, at most its capacity (a key is
never further behind than an empty bucket; a reservation made beyond that under the old
limits keeps its slot and is not charged again). Integers only, so that every store
repeats it exactly: the quotient of two integers below 2**53, and a product below the new
capacity times ``n``, which ``rational_spec`` keeps below 2**53.
"""

from __future__ import annotations

from ratekeeper.algorithms.base import ceil_div

__all__ = ["carried"]


def carried(consumed: int, n_old: int, cap: int, n: int) -> int:
    """What ``consumed`` units of the old scale (``n_old`` per unit of cost, > 0) are in the
    new one (``n`` per unit of cost, capacity ``cap``): whole units of cost, rounded up,
    at most ``cap``."""
    units = ceil_div(consumed, n_old)
    return (units if units < cap else cap) * n
