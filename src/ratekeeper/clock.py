"""Clocks: where the memory store reads "now" and where ``acquire`` waits.

Stores with a server use the server's clock; the memory store and every wait use a
``Clock``. Tests inject ``ratekeeper.testing.FakeClock`` so no test sleeps.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

__all__ = ["EPOCH_OFFSET_NS", "Clock", "SystemClock"]

EPOCH_OFFSET_NS = time.time_ns() - time.monotonic_ns()
"""What turns the monotonic clock into Unix time, read once: ``SystemClock`` counts from the
Unix epoch (so the memory store's fixed windows start where Redis's and PostgreSQL's do,
on the wall clock's minute, hour...) and still never steps back."""


@runtime_checkable
class Clock(Protocol):
    """A source of monotonic time in integer microseconds that can also wait.

    An implementation guarantees that ``now_us`` never decreases and that after
    ``sleep(s)`` (or ``await asleep(s)``) returns, ``now_us`` has advanced by at least
    ``s`` seconds.
    """

    def now_us(self) -> int: ...

    def sleep(self, seconds: float) -> None: ...

    async def asleep(self, seconds: float) -> None: ...


class SystemClock:
    """The process's monotonic clock, counted from the Unix epoch (``EPOCH_OFFSET_NS``)."""

    __slots__ = ()

    def now_us(self) -> int:
        return (time.monotonic_ns() + EPOCH_OFFSET_NS) // 1000

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
