"""``Op``: one request to a store, the one shape every layer passes on.

The limiters build an ``Op`` from a call's arguments once they are checked; the waiting
logic of ``acquire`` (``ratekeeper.limiter.flows``) yields ops; the failure policy
answers for them; every store decides them (``Store.decide(op)``), the server stores
queue and coalesce them and put them on the wire (``ratekeeper.stores.wire``) as they
are. Its fields, in this order (an ``Op`` is a tuple, so a store may unpack it)::

    mode      DECIDE (charge when admitted), PEEK (decide, charge nothing), REFUND or
              CHARGE (charge without a check: the key may go into debt)
    plan      the rule's ``Plan`` (its algorithm and limits, precomputed)
    key       the caller's key, checked
    cost      a non-negative integer (for REFUND: what to give back)
    max_wait  µs a reservation may reach ahead (``acquire``), else None
    lease_id  the concurrency lease to take or release, else None
"""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan

__all__ = ["CHARGE", "DECIDE", "MODES", "PEEK", "REFUND", "Op"]

DECIDE = "d"
PEEK = "p"
REFUND = "r"
CHARGE = "c"
MODES = (DECIDE, PEEK, REFUND, CHARGE)
"""The letters are the wire's too: Lua and PL/pgSQL read them as they are."""


class Op(tuple[Any, ...]):
    """One request to a store: ``(mode, plan, key, cost, max_wait, lease_id)``.

    Build one with ``Op.decide(...)``, ``Op.peek(...)``, ``Op.refund(...)`` or
    ``Op.charge(...)``; the hot
    paths write ``Op((DECIDE, plan, key, cost, None, lease_id))``, which costs a tuple and
    no Python-level constructor. Read it by name (``op.plan``) or unpack it.
    """

    __slots__ = ()

    if TYPE_CHECKING:

        @property
        def mode(self) -> str: ...
        @property
        def plan(self) -> Plan: ...
        @property
        def key(self) -> str: ...
        @property
        def cost(self) -> int: ...
        @property
        def max_wait(self) -> int | None: ...
        @property
        def lease_id(self) -> str | None: ...

    else:
        # C-level getters: reading a field costs no Python frame
        mode = property(itemgetter(0), doc="DECIDE, PEEK, REFUND or CHARGE")
        plan = property(itemgetter(1), doc="the rule's Plan")
        key = property(itemgetter(2), doc="the caller's key")
        cost = property(itemgetter(3), doc="what to charge (or give back)")
        max_wait = property(itemgetter(4), doc="µs a reservation may reach ahead, else None")
        lease_id = property(itemgetter(5), doc="the concurrency lease, else None")

    @classmethod
    def decide(
        cls, plan: Plan, key: str, cost: int = 1, max_wait: int | None = None, lease_id: str | None = None
    ) -> Op:
        """Charge ``cost`` when every limit admits it."""
        return cls((DECIDE, plan, key, cost, max_wait, lease_id))

    @classmethod
    def peek(cls, plan: Plan, key: str, cost: int = 1, lease_id: str | None = None) -> Op:
        """Decide ``cost`` and charge nothing."""
        return cls((PEEK, plan, key, cost, None, lease_id))

    @classmethod
    def refund(cls, plan: Plan, key: str, cost: int, lease_id: str | None = None) -> Op:
        """Give back ``cost`` charged earlier (or release ``lease_id``)."""
        return cls((REFUND, plan, key, cost, None, lease_id))

    @classmethod
    def charge(cls, plan: Plan, key: str, cost: int) -> Op:
        """Charge ``cost`` whatever is left: the key may go into debt (``Algorithm.charge``)."""
        return cls((CHARGE, plan, key, cost, None, None))

    @property
    def charges(self) -> bool:
        """Whether an admitted op is written (DECIDE, CHARGE), rather than only looked at."""
        return self.mode in (DECIDE, CHARGE)

    def __repr__(self) -> str:
        mode = {DECIDE: "decide", PEEK: "peek", REFUND: "refund", CHARGE: "charge"}.get(self[0], repr(self[0]))
        extra = "".join(
            f", {name}={value!r}" for name, value in (("max_wait", self[4]), ("lease_id", self[5])) if value is not None
        )
        return f"Op.{mode}({self[1]!r}, {self[2]!r}, {self[3]!r}{extra})"
