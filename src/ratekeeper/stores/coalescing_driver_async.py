"""``AsyncDriver``: what the asyncio driver of ``Coalescer`` (``coalescing_asyncio.py``) holds,
and how it sends one call and decides its ops again apart when one op failed it.

This module is the source of ``coalescing_driver.py`` (``Driver``, the base of the thread
driver in ``coalescing_threads.py``): ``tools/unasync.py`` writes it, and a test fails when
the two differ. Edit this one, then run ``python tools/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ratekeeper.stores.coalescing import Coalescer, Reply, apart, held_weakly, needs_apart, splitter

__all__ = ["AsyncDriver"]

OpT = TypeVar("OpT")
W = TypeVar("W")


class AsyncDriver(Generic[OpT, W]):
    """The sans-IO ``core``, the store's ``run`` (held weakly: ``held_weakly``), and what the
    store says about its errors (``store_down``; ``applied_nothing``, see ``splitter``)."""

    def __init__(
        self,
        core: Coalescer[OpT, W],
        run: Callable[..., Any],
        store_down: Callable[[BaseException], bool],
        timeout: float,
        name: str,
        applied_nothing: Callable[[BaseException], bool] | None,
    ) -> None:
        self.core = core
        self._run, self._owner = held_weakly(run)
        self._store_down = store_down
        self._may_split = splitter(applied_nothing)
        self.timeout = timeout
        self.name = name

    async def _send(self, ops: Sequence[OpT], now: int | None) -> Sequence[Any]:
        """One call of ``ops``: each op's result, or that op's own error. A call of several
        ops that failed because of one of them is decided again apart (``_apart``), so no
        caller gets another's error; one that fails as a whole raises."""
        try:
            results: Sequence[Any] = await self._run(self._owner(), ops, now)
        except Exception as exc:
            if len(ops) < 2 or not self._may_split(exc):
                raise
            return await self._apart(ops, now, exc)
        if len(ops) > 1 and needs_apart(results, self._may_split):
            return await self._apart(ops, now, results)
        return results

    async def _apart(self, ops: Sequence[OpT], now: int | None, first: Reply) -> list[Any]:
        """Each op's result or its own error, after the call of all of them replied ``first``
        (see ``apart`` in ``coalescing.py``)."""
        plan = apart(ops, first, self._may_split, self._store_down)
        try:
            call = next(plan)
            while True:
                try:
                    reply: Reply = await self._run(self._owner(), call, now)
                except Exception as exc:  # noqa: BLE001 (handed to that call's ops alone)
                    reply = exc
                call = plan.send(reply)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
