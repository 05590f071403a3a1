"""``AsyncServiceStore``: the ratekeeper service as a store for ``AsyncLimiter``.

Concurrent calls coalesce (``stores/coalescing.py``, with its guarantees): calls made
in the same event-loop tick, and calls made while ``max_in_flight`` calls are out, go
together as one ``POST /v1/store``, which the service decides in order on its own store:
a hot key costs a fraction of a round trip per decision, with the decisions of serial
calls.

The store holds a planner (``ServicePlanner``: the body of a call, its reply read) and a
shell (``shell_async.py``: sends it). The source of ``store.py``: ``tools/unasync.py``
writes ``ServiceStore`` from it; what the two do differently comes from
``driver_asyncio.py`` / ``driver_threads.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import StoreError
from ratekeeper.stores.bounds import check_op
from ratekeeper.stores.service.driver_asyncio import coalescer
from ratekeeper.stores.service.options import ServiceOptions
from ratekeeper.stores.service.planner import ServicePlanner
from ratekeeper.stores.service.protocol import reset_op
from ratekeeper.stores.service.shell_async import AsyncServiceShell

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op

__all__ = ["AsyncServiceStore"]


class AsyncServiceStore:
    """``http://host:8080`` (or ``https://``); options in ``ServiceOptions``. The coalescing
    guarantees of ``stores/coalescing.py`` hold."""

    def __init__(self, url: str, **options: Any) -> None:
        self.options = ServiceOptions(url, options)
        self.planner = ServicePlanner()
        self.shell = AsyncServiceShell(self.options)
        self._coalescer = coalescer(self._run, self.options)

    async def _call(
        self, ops: Sequence[Op], now: int | None, atomic: bool, what: str
    ) -> list[Decision | StoreError | bool | None]:
        """One call deciding ``ops`` in order, one result each."""
        planner = self.planner
        return planner.read(ops, *await self.shell.post(planner.plan(ops, now, atomic), what))

    async def _run(self, ops: Sequence[Op], now: int | None) -> list[Decision | StoreError | bool | None]:
        """A coalesced call (see ``stores/coalescing.py``)."""
        results = await self._call(ops, now, False, "a decision")
        if len(ops) == 1 and isinstance(results[0], StoreError):
            raise results[0]  # a lone caller's path does not check its result
        return results

    async def _submit(self, op: Op, now: int | None) -> Decision | bool | None:
        check_op(op, now)  # refused here, as on every store: never sent to the service
        if self.options.batching:
            return await self._coalescer.submit(op, now)  # type: ignore[return-value]
        return (await self._run([op], now))[0]  # type: ignore[return-value]

    async def decide(self, op: Op, now: int | None = None) -> Decision:
        decision = await self._submit(op, now)
        assert decision is not None and not isinstance(decision, bool)
        return decision

    async def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        for op in ops:
            check_op(op, now)
        decisions: list[Decision] = []
        for result in await self._call(ops, now, True, "a batch"):
            if isinstance(result, StoreError):
                raise result
            assert result is not None and not isinstance(result, bool)
            decisions.append(result)
        return tuple(decisions)

    async def refund(self, op: Op, now: int | None = None) -> bool:
        return await self._submit(op, now) is True

    async def reset(self, plan: Plan, key: str) -> None:
        result = (await self._call([reset_op(plan, key)], None, False, "a reset"))[0]
        if isinstance(result, StoreError):
            raise result

    async def aclose(self) -> None:
        """Answer every op queued or in flight, then close the connections."""
        await self._coalescer.drain()
        await self.shell.aclose()
