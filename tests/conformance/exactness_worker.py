"""What each process of the exactness test runs (imported by spawned children).

A process opens its own ``Limiter`` (threads) or ``AsyncLimiter`` (tasks) on the store,
and for each exact algorithm in turn waits at a barrier shared by every process, then
hammers ONE key from all its threads or tasks at once, counting the admissions; then the
same for a ``try_acquire_many`` of two rules on that key. It puts
``("ok", {algorithm: admitted, or the traceback of the error that stopped it})`` on the
queue, or ``("error", traceback)`` when the process itself failed.
"""

from __future__ import annotations

import asyncio
import threading
import traceback
from typing import Any

from ratekeeper import AsyncLimiter, Limiter, Rule

__all__ = ["BATCH", "BATCH_LIMIT", "CASES", "LIMIT", "NAMES", "case_rules", "hammer"]

LIMIT = 50

CASES: tuple[tuple[str, str], ...] = (
    # Aligned windows of ten years: the next boundary (epoch-aligned) is in 2029 (then 2039).
    ("fixed_window", f"{LIMIT}/3650d"),
    ("sliding_window_log", f"{LIMIT}/day"),
    # Buckets that refill one unit every 1728 s: nothing refills during the test.
    ("token_bucket", f"{LIMIT}/day"),
    ("gcra", f"{LIMIT}/day"),
    ("leaky_bucket", f"{LIMIT}/day"),
    # Leases are never released, and expire after an hour.
    ("concurrency", f"{LIMIT}/hour"),
)
"""Each exact algorithm with a limit that nothing frees during the test."""

BATCH = "try_acquire_many"
BATCH_LIMIT = 30
BATCH_RULES: tuple[tuple[str, str], ...] = (("gcra", f"{BATCH_LIMIT}/day"), ("sliding_window_log", f"{LIMIT}/day"))
"""A batch of two rules on the one key (one hash slot, one row: one atomic call on every
store): admitted exactly 30 times, and the looser rule charged only by those 30."""

NAMES = (*(algorithm for algorithm, _ in CASES), BATCH)


def case_rules(name: str) -> list[Rule]:
    """The rules one attempt of case ``name`` charges (all of them, or none)."""
    if name == BATCH:
        return [Rule(f"exactness-batch-{algorithm}", [limit], algorithm) for algorithm, limit in BATCH_RULES]
    return [Rule(f"exactness-{name}", [limit], name) for algorithm, limit in CASES if algorithm == name]


BARRIER_TIMEOUT = 60.0
WARM_UP_KEY = "warm-up"


def hammer(
    url: str,
    options: dict[str, Any],
    mode: str,
    key: str,
    workers: int,
    attempts: int,
    barrier: Any,
    queue: Any,
    inherited: Limiter | None = None,
) -> None:
    """Run every case in this process; report the admissions (or the error) on ``queue``.

    ``mode``: "sync" (a ``Limiter`` of this process), "async" (an ``AsyncLimiter``) or
    "fork" (``inherited``: the parent's ``Limiter``, opened and used before the fork, as a
    web server that preloads its app shares it; left open here, since closing a connection
    inherited from the parent could close it for the parent too).
    """
    try:
        if mode == "async":
            result = asyncio.run(_hammer_tasks(url, options, key, workers, attempts, barrier))
        elif inherited is not None:
            result = _hammer_threads(inherited, key, workers, attempts, barrier)
        else:
            with Limiter(url, **options) as limiter:
                result = _hammer_threads(limiter, key, workers, attempts, barrier)
    except BaseException:  # noqa: BLE001 - the parent reports it
        queue.put(("error", traceback.format_exc()))
        barrier.abort()  # the other processes stop waiting for this one
    else:
        queue.put(("ok", result))


def _hammer_threads(limiter: Limiter, key: str, workers: int, attempts: int, barrier: Any) -> dict[str, int | str]:
    admitted: dict[str, int | str] = {}
    for name in NAMES:  # connections and scripts ready before the first barrier
        for rule in case_rules(name):
            limiter.peek(rule, WARM_UP_KEY)
    for name in NAMES:
        rules = case_rules(name)
        counts = [0] * workers
        errors: list[BaseException] = []
        start = threading.Barrier(workers)

        def attempt(rules: list[Rule] = rules) -> bool:
            if len(rules) == 1:
                return bool(limiter.try_acquire(rules[0], key))
            return bool(limiter.try_acquire_many([(rule, key) for rule in rules]))

        def run(
            i: int,
            attempt: Any = attempt,
            counts: list[int] = counts,
            start: threading.Barrier = start,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                start.wait(BARRIER_TIMEOUT)
                counts[i] = sum(1 for _ in range(attempts) if attempt())
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
        barrier.wait(BARRIER_TIMEOUT)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        admitted[name] = "".join(traceback.format_exception(errors[0])) if errors else sum(counts)
    return admitted


async def _hammer_tasks(
    url: str, options: dict[str, Any], key: str, workers: int, attempts: int, barrier: Any
) -> dict[str, int | str]:
    admitted: dict[str, int | str] = {}
    async with AsyncLimiter(url, **options) as limiter:
        for name in NAMES:  # connections and scripts ready before the first barrier
            for rule in case_rules(name):
                await limiter.peek(rule, WARM_UP_KEY)
        for name in NAMES:
            rules = case_rules(name)

            async def run(rules: list[Rule] = rules) -> int:
                n = 0
                for _ in range(attempts):
                    if len(rules) == 1:
                        n += bool(await limiter.try_acquire(rules[0], key))
                    else:
                        n += bool(await limiter.try_acquire_many([(rule, key) for rule in rules]))
                return n

            await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT)
            try:
                admitted[name] = sum(await asyncio.gather(*(run() for _ in range(workers))))
            except Exception:  # noqa: BLE001 - reported per case by the parent
                admitted[name] = traceback.format_exc()
    return admitted
