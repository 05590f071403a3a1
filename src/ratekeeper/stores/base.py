"""The ``Store`` role: what the limiters ask of a store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision

__all__ = ["AsyncStore", "InProcessAsync", "Item", "Store"]

Item = tuple["Plan", str, int, "str | None"]
"""One part of an all-or-nothing batch: (plan, key, cost, lease id)."""


class Store(Protocol):
    """Where the state of each (rule, key) lives and where it is decided.

    An implementation guarantees: each call is atomic for its keys (no interleaving with
    another call on the same key); ``decide`` gives exactly the decision the rule's
    reference algorithm gives on the stored state at the store's ``now`` (or at the
    ``now`` passed, for tests); ``decide_many`` charges every item or none; nothing is
    charged by ``commit=False``; state is kept at least until it is whole again, unless
    a documented bound (``max_keys``) evicts it.
    """

    def decide(
        self,
        plan: Plan,
        key: str,
        cost: int,
        max_wait: int | None = None,
        lease_id: str | None = None,
        now: int | None = None,
        commit: bool = True,
    ) -> Decision: ...

    def decide_many(self, items: Sequence[Item], now: int | None = None) -> tuple[Decision, ...]: ...

    def refund(self, plan: Plan, key: str, cost: int, lease_id: str | None = None, now: int | None = None) -> None: ...

    def reset(self, plan: Plan, key: str) -> None: ...

    def close(self) -> None: ...


class AsyncStore(Protocol):
    """The asyncio twin of ``Store``: the same guarantees, awaited."""

    async def decide(
        self,
        plan: Plan,
        key: str,
        cost: int,
        max_wait: int | None = None,
        lease_id: str | None = None,
        now: int | None = None,
        commit: bool = True,
    ) -> Decision: ...

    async def decide_many(self, items: Sequence[Item], now: int | None = None) -> tuple[Decision, ...]: ...

    async def refund(
        self, plan: Plan, key: str, cost: int, lease_id: str | None = None, now: int | None = None
    ) -> None: ...

    async def reset(self, plan: Plan, key: str) -> None: ...

    async def aclose(self) -> None: ...


class InProcessAsync:
    """An ``AsyncStore`` over a store that decides in this process without I/O (memory).

    Its calls hold a lock for microseconds and never wait on a socket, so they run on
    the event loop directly.
    """

    def __init__(self, store: Store) -> None:
        self.sync = store
        self.clock = getattr(store, "clock", None)

    async def decide(
        self,
        plan: Plan,
        key: str,
        cost: int,
        max_wait: int | None = None,
        lease_id: str | None = None,
        now: int | None = None,
        commit: bool = True,
    ) -> Decision:
        return self.sync.decide(plan, key, cost, max_wait, lease_id, now, commit)

    async def decide_many(self, items: Sequence[Item], now: int | None = None) -> tuple[Decision, ...]:
        return self.sync.decide_many(items, now)

    async def refund(
        self, plan: Plan, key: str, cost: int, lease_id: str | None = None, now: int | None = None
    ) -> None:
        self.sync.refund(plan, key, cost, lease_id, now)

    async def reset(self, plan: Plan, key: str) -> None:
        self.sync.reset(plan, key)

    async def aclose(self) -> None:
        self.sync.close()
