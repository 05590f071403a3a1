"""Helpers for tests, yours and ours: a clock that only moves when told to."""

from __future__ import annotations

import asyncio
import threading

__all__ = ["FakeClock"]


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
