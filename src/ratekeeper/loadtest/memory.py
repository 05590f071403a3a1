"""The server's resident memory over a run, read from ``/proc/PID/status`` (Linux) twice
a second; on a system without ``/proc`` there are no samples and no memory chart."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

__all__ = ["RssSampler", "rss_bytes"]

INTERVAL = 0.5


def rss_bytes(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


class RssSampler:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, int]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self, t0: float) -> None:
        self._task = asyncio.create_task(self._sample(t0))

    async def _sample(self, t0: float) -> None:
        while True:
            rss = rss_bytes(self.pid)
            if rss is None:
                return
            self.samples.append((time.monotonic() - t0, rss))
            await asyncio.sleep(INTERVAL)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
