"""Timing with latencies, for the benchmarks of the server stores (Redis, PostgreSQL).

A call to a server store costs a round trip (tens to hundreds of µs), so every call is
timed on its own with ``time.perf_counter_ns`` (about 0.1 µs, noise beside a round
trip) and a cell reports decisions per second, the median and the 99th percentile of
the latency, and how many calls raised.

Three drivers, one per way an application calls a limiter:

- ``time_sync``: one thread, calls back to back (a sync client on one connection).
- ``time_threads``: ``workers`` threads sharing one limiter (a threaded server).
- ``time_tasks``: ``tasks`` asyncio tasks sharing one limiter (an async server).

Each takes ``decide(key) -> bool`` (or its coroutine twin) and an iterator of keys
shared by every worker, and stops every worker at the same deadline. A call that raises
counts as an error, not as a decision (its latency is kept: the caller waited that
long), and the first error's text is kept for the report.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass

__all__ = [
    "AsyncDecide",
    "AsyncRunner",
    "Decide",
    "Sample",
    "SyncRunner",
    "Target",
    "async_runner",
    "percentile",
    "time_sync",
    "time_tasks",
    "time_threads",
]

Decide = Callable[[str], bool]
"""``decide(key)``: one decision for ``key``; True when admitted."""

AsyncDecide = Callable[[str], Awaitable[bool]]


def percentile(sorted_ns: Sequence[int], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted nanosecond latencies, in µs (nearest rank)."""
    if not sorted_ns:
        return 0.0
    index = min(len(sorted_ns) - 1, max(0, round(q * (len(sorted_ns) - 1))))
    return sorted_ns[index] / 1000.0


@dataclass(frozen=True, slots=True)
class Sample:
    """What one driver measured: decisions, admissions, errors, wall and CPU time, latencies."""

    calls: int
    allowed: int
    errors: int
    seconds: float
    cpu_seconds: float
    p50_us: float
    p99_us: float
    first_error: str = ""

    @property
    def rate(self) -> float:
        """Decisions per second (allowed and denied alike; errors excluded)."""
        return self.calls / self.seconds if self.seconds > 0 else 0.0


class _Tally:
    """Latencies and counts of one worker; merged into a ``Sample`` at the end."""

    __slots__ = ("allowed", "calls", "errors", "first_error", "latencies")

    def __init__(self) -> None:
        self.latencies: list[int] = []
        self.calls = 0
        self.allowed = 0
        self.errors = 0
        self.first_error = ""

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:160]


def _merge(tallies: Sequence[_Tally], seconds: float, cpu_seconds: float) -> Sample:
    latencies = sorted(lat for t in tallies for lat in t.latencies)
    return Sample(
        calls=sum(t.calls for t in tallies),
        allowed=sum(t.allowed for t in tallies),
        errors=sum(t.errors for t in tallies),
        seconds=seconds,
        cpu_seconds=cpu_seconds,
        p50_us=percentile(latencies, 0.50),
        p99_us=percentile(latencies, 0.99),
        first_error=next((t.first_error for t in tallies if t.first_error), ""),
    )


def _work(decide: Decide, keys: Iterator[str], deadline_ns: int, tally: _Tally) -> None:
    perf = time.perf_counter_ns
    latencies = tally.latencies
    end = perf()
    while end < deadline_ns:
        key = next(keys)
        start = perf()
        try:
            ok = decide(key)
        except Exception as exc:  # noqa: BLE001 - an error is a measured outcome, not the end of the cell
            end = perf()
            latencies.append(end - start)
            tally.error(exc)
            continue
        end = perf()
        latencies.append(end - start)
        tally.calls += 1
        if ok:
            tally.allowed += 1


def time_sync(decide: Decide, keys: Iterator[str], duration: float) -> Sample:
    """Call ``decide`` back to back in this thread for ``duration`` seconds."""
    tally = _Tally()
    cpu = time.process_time()
    start = time.perf_counter_ns()
    _work(decide, keys, start + int(duration * 1e9), tally)
    seconds = (time.perf_counter_ns() - start) / 1e9
    return _merge([tally], seconds, time.process_time() - cpu)


def time_threads(decide: Decide, keys: Iterator[str], duration: float, workers: int) -> Sample:
    """``workers`` threads call ``decide`` back to back, all released at once, for ``duration``."""
    tallies = [_Tally() for _ in range(workers)]
    barrier = threading.Barrier(workers + 1)
    deadline = [0]

    def worker(tally: _Tally) -> None:
        barrier.wait()
        _work(decide, keys, deadline[0], tally)

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in tallies]
    for thread in threads:
        thread.start()
    cpu = time.process_time()
    start = time.perf_counter_ns()
    deadline[0] = start + int(duration * 1e9)
    barrier.wait()
    for thread in threads:
        thread.join()
    seconds = (time.perf_counter_ns() - start) / 1e9
    return _merge(tallies, seconds, time.process_time() - cpu)


async def time_tasks(decide: AsyncDecide, keys: Iterator[str], duration: float, tasks: int) -> Sample:
    """``tasks`` asyncio tasks await ``decide`` back to back for ``duration`` seconds."""
    tallies = [_Tally() for _ in range(tasks)]
    perf = time.perf_counter_ns

    async def worker(tally: _Tally, deadline_ns: int) -> None:
        latencies = tally.latencies
        end = perf()
        while end < deadline_ns:
            key = next(keys)
            begin = perf()
            try:
                ok = await decide(key)
            except Exception as exc:  # noqa: BLE001 - an error is a measured outcome
                end = perf()
                latencies.append(end - begin)
                tally.error(exc)
                continue
            end = perf()
            latencies.append(end - begin)
            tally.calls += 1
            if ok:
                tally.allowed += 1

    cpu = time.process_time()
    start = perf()
    deadline = start + int(duration * 1e9)
    await asyncio.gather(*(worker(t, deadline) for t in tallies))
    seconds = (perf() - start) / 1e9
    return _merge(tallies, seconds, time.process_time() - cpu)


# -- subjects of the server benchmarks -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """Where a subject keeps its state: the server URL and a namespace of its own.

    ``prefix`` is a Redis key prefix or a PostgreSQL schema, unique to the run, so the
    run can remove exactly what it created.
    """

    url: str
    prefix: str


@dataclass(slots=True)
class SyncRunner:
    """A built limiter: ``decide(key)`` makes one decision, ``close()`` frees it."""

    decide: Decide
    close: Callable[[], None] = lambda: None


@dataclass(slots=True)
class AsyncRunner:
    """The asyncio twin of ``SyncRunner``."""

    decide: AsyncDecide
    aclose: Callable[[], Awaitable[None]]


async def _nothing() -> None:
    return None


def async_runner(decide: AsyncDecide, aclose: Callable[[], Awaitable[None]] | None = None) -> AsyncRunner:
    """An ``AsyncRunner`` whose ``aclose`` defaults to doing nothing."""
    return AsyncRunner(decide, aclose or _nothing)
