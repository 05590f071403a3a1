"""The ``Store`` role: what the limiters ask of a store.

Every request is an ``Op`` (``ratekeeper.op``): ``decide`` takes a DECIDE, PEEK or CHARGE
op (a charge without a check: ``Algorithm.charge``), ``refund`` a REFUND op (False for
the release of a lease that rule and key did not hold: expired, released, another key's;
True otherwise), ``decide_many`` a list of DECIDE ops charged all or nothing.
``now`` (µs on the store's clock) is for tests and the conformance suite; None means the
store's own clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op

__all__ = ["AsyncStore", "InProcessAsync", "InProcessStore", "Store"]


class Store(Protocol):
    """Where the state of each (rule, key) lives and where it is decided.

    An implementation guarantees: each call is atomic for its keys (no interleaving with
    another call on the same key); ``decide`` gives exactly the decision the rule's
    reference algorithm gives on the stored state at the store's ``now`` (or at the
    ``now`` passed, for tests); ``decide_many`` charges every op or none; a PEEK op
    charges nothing; state is kept at least until it is whole again, unless a documented
    bound (``max_keys``) evicts it. A store that fails raises ``StoreError``
    (``StoreTimeout`` when it did not answer in time), never another exception of its
    client library, and a failure of one caller's op never reaches another caller.
    """

    def decide(self, op: Op, now: int | None = None) -> Decision: ...

    def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]: ...

    def refund(self, op: Op, now: int | None = None) -> bool: ...

    def reset(self, plan: Plan, key: str) -> None: ...

    def close(self) -> None: ...


class AsyncStore(Protocol):
    """The asyncio twin of ``Store``: the same guarantees, awaited."""

    async def decide(self, op: Op, now: int | None = None) -> Decision: ...

    async def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]: ...

    async def refund(self, op: Op, now: int | None = None) -> bool: ...

    async def reset(self, plan: Plan, key: str) -> None: ...

    async def aclose(self) -> None: ...


class InProcessStore(Store, Protocol):
    """A ``Store`` that decides in this process without I/O (``in_process`` is True): the
    limiters' hot path calls ``decide_fields(mode, plan, key, cost, max_wait, lease_id,
    now)``, the fields of an ``Op`` as arguments, which must answer as ``decide(op, now)``
    for DECIDE and PEEK (a CHARGE goes through ``decide``)."""

    in_process: bool

    def decide_fields(
        self,
        mode: str,
        plan: Plan,
        key: str,
        cost: int,
        max_wait: int | None,
        lease_id: str | None,
        now: int | None = None,
    ) -> Decision: ...


class InProcessAsync:
    """An ``AsyncStore`` over a store that decides in this process without I/O (memory).

    Its calls hold a lock for microseconds and never wait on a socket, so they run on
    the event loop directly. ``sync`` is the store itself: ``AsyncLimiter`` calls its
    ``decide_fields`` without a coroutine in between (see ``InProcessStore``).
    """

    def __init__(self, store: Store) -> None:
        self.sync = store
        self.clock = getattr(store, "clock", None)

    async def decide(self, op: Op, now: int | None = None) -> Decision:
        return self.sync.decide(op, now)

    async def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        return self.sync.decide_many(ops, now)

    async def refund(self, op: Op, now: int | None = None) -> bool:
        return self.sync.refund(op, now)

    async def reset(self, plan: Plan, key: str) -> None:
        self.sync.reset(plan, key)

    async def aclose(self) -> None:
        self.sync.close()
