"""``ServiceStore``: the ratekeeper service as a store for ``Limiter`` (a planner and a shell).

Generated from ``store_async.py`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import StoreError
from ratekeeper.stores.bounds import check_op
from ratekeeper.stores.service.driver_threads import coalescer
from ratekeeper.stores.service.options import ServiceOptions
from ratekeeper.stores.service.planner import ServicePlanner
from ratekeeper.stores.service.protocol import reset_op
from ratekeeper.stores.service.shell import ServiceShell

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op

__all__ = ["ServiceStore"]


class ServiceStore:
    """``http://host:8080`` (or ``https://``); options in ``ServiceOptions``. The coalescing
    guarantees of ``stores/coalescing.py`` hold."""

    def __init__(self, url: str, **options: Any) -> None:
        self.options = ServiceOptions(url, options)
        self.planner = ServicePlanner()
        self.shell = ServiceShell(self.options)
        self._coalescer = coalescer(self._run, self.options)

    def _call(
        self, ops: Sequence[Op], now: int | None, atomic: bool, what: str
    ) -> list[Decision | StoreError | bool | None]:
        """One call deciding ``ops`` in order, one result each."""
        planner = self.planner
        return planner.read(ops, *self.shell.post(planner.plan(ops, now, atomic), what))

    def _run(self, ops: Sequence[Op], now: int | None) -> list[Decision | StoreError | bool | None]:
        """A coalesced call (see ``stores/coalescing.py``)."""
        results = self._call(ops, now, False, "a decision")
        if len(ops) == 1 and isinstance(results[0], StoreError):
            raise results[0]  # a lone caller's path does not check its result
        return results

    def _submit(self, op: Op, now: int | None) -> Decision | bool | None:
        check_op(op, now)  # refused here, as on every store: never sent to the service
        if self.options.batching:
            return self._coalescer.submit(op, now)  # type: ignore[return-value]
        return (self._run([op], now))[0]  # type: ignore[return-value]

    def decide(self, op: Op, now: int | None = None) -> Decision:
        decision = self._submit(op, now)
        assert decision is not None and not isinstance(decision, bool)
        return decision

    def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        for op in ops:
            check_op(op, now)
        decisions: list[Decision] = []
        for result in self._call(ops, now, True, "a batch"):
            if isinstance(result, StoreError):
                raise result
            assert result is not None and not isinstance(result, bool)
            decisions.append(result)
        return tuple(decisions)

    def refund(self, op: Op, now: int | None = None) -> bool:
        return self._submit(op, now) is True

    def reset(self, plan: Plan, key: str) -> None:
        result = (self._call([reset_op(plan, key)], None, False, "a reset"))[0]
        if isinstance(result, StoreError):
            raise result

    def close(self) -> None:
        """Answer every op queued or in flight, then close the connections."""
        self._coalescer.drain()
        self.shell.close()
