"""Helpers for tests, yours and ours: a clock that only moves when told to, and an observer
that keeps every report."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.errors import StoreError

__all__ = ["FakeClock", "RecordingObserver"]


class FakeClock:
    """A ``Clock`` whose time moves only through ``advance`` and ``sleep``.

    ``sleep`` advances the clock instead of waiting, so code that waits (``acquire``)
    runs instantly and deterministically. Starts at ``start_us`` (default 1_000_000_000).
    """

    def __init__(self, start_us: int = 1_000_000_000) -> None:
        self._now = start_us
        self._lock = threading.Lock()
        self.slept: list[float] = []

    def now_us(self) -> int:
        return self._now

    def advance(self, seconds: float = 0.0, *, us: int = 0) -> int:
        """Move time forward by ``seconds`` (and/or ``us`` microseconds); return the new now."""
        step = round(seconds * 1_000_000) + us
        if step < 0:
            raise ValueError("FakeClock only moves forward")
        with self._lock:
            self._now += step
            return self._now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if seconds > 0:
            self.advance(seconds)

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)


class RecordingObserver:
    """An ``Observer`` (``ratekeeper.limiter.observer``) that keeps every report in order:
    ``decisions``, ``charges`` (decision, cost), ``refunds`` (rule, cost), ``store_calls``
    (seconds, error) and ``breaker_changes`` (old, new)."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []
        self.charges: list[tuple[Decision, int]] = []
        self.refunds: list[tuple[str, int]] = []
        self.store_calls: list[tuple[float, StoreError | None]] = []
        self.breaker_changes: list[tuple[str, str]] = []

    def decided(self, decision: Decision) -> None:
        self.decisions.append(decision)

    def charged(self, decision: Decision, cost: int) -> None:
        self.charges.append((decision, cost))

    def refunded(self, rule: str, cost: int) -> None:
        self.refunds.append((rule, cost))

    def store_call(self, seconds: float, error: StoreError | None) -> None:
        self.store_calls.append((seconds, error))

    def breaker_changed(self, old: str, new: str) -> None:
        self.breaker_changes.append((old, new))
