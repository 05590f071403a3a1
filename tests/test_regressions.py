"""Regressions found by review: each test pins the fixed behaviour; its docstring tells the bug."""

from __future__ import annotations

import asyncio
import time

from ratekeeper import Limiter, Rule


def test_sync_limiter_decorator_with_wait_does_not_block_event_loop() -> None:
    """Bug: Limiter.limit(..., wait=s) on an async function calls the blocking
    Limiter.acquire inside the coroutine, which time.sleep()s: every other task on the
    event loop is frozen for up to `wait` seconds. (docs/choices.md says calling the
    memory store from a coroutine is fine; waiting with time.sleep is not.)"""
    limiter = Limiter()
    rule = Rule("export", ["1/300ms"])

    @limiter.limit(rule, wait=2.0)
    async def export() -> int:
        return 1

    async def main() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        start = time.monotonic()
        await export()
        await export()  # waits ~0.3 s for its turn
        elapsed = time.monotonic() - start
        task.cancel()
        assert elapsed > 0.2
        return ticks

    assert asyncio.run(main()) >= 5, "the event loop was blocked while the decorator waited"


# -- error messages --------------------------------------------------------------------
