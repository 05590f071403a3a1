"""The open-loop load: a fixed schedule of sends per instance, kept whatever the answers' latency.

Each instance gets its own schedule (``t0 + i / rate`` within each phase), the users taken in
turn, so both instances ask for the same user at about the same moment: the race the shared
store must settle. A send is never skipped or delayed by a slow answer (each is its own task);
a send the event loop could only start late is marked with its lag, and latency is measured
from the intended send time, so a stalled client cannot hide a slow server (coordinated
omission, as wrk2 and oha correct for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import aiohttp

# (requests per second per instance, seconds at --speed 1): the partner team's ten-minute ramp.
RAMP: tuple[tuple[float, float], ...] = ((5.0, 180.0), (50.0, 180.0), (100.0, 240.0))


@dataclass(frozen=True)
class Sample:
    """One request: where it went, when it was meant to leave and did, and what came back."""

    instance: int
    route: str  # "limited" (GET /items/{user}) or "floor" (GET /unlimited/{user})
    user: str
    intended: float  # seconds since the run's start
    sent: float  # seconds since the run's start, when the request was handed to the client
    latency: float  # seconds from ``intended`` to the answer
    status: int  # HTTP status; 0 when no answer came (a connection error or a timeout)


@dataclass
class Progress:
    """Running counts of the limited route, for the line printed while the run goes."""

    sent: int = 0
    admitted: int = 0
    denied: int = 0
    errors: int = 0

    def count(self, status: int) -> None:
        self.sent += 1
        self.admitted += status == 200
        self.denied += status == 429
        self.errors += status not in (200, 429)


async def _report_progress(progress: Progress, t0: float, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        p = progress
        print(
            f"  t={time.perf_counter() - t0:6.1f} s  sent {p.sent}  admitted {p.admitted}  denied {p.denied}"
            f"  errors {p.errors}",
            flush=True,
        )


def schedule(phases: tuple[tuple[float, float], ...], speed: float) -> list[float]:
    """Intended send times (seconds from the start) of one instance through ``phases``."""
    times: list[float] = []
    start = 0.0
    for rate, seconds in phases:
        length = seconds / speed
        count = int(length * rate)
        times.extend(start + i / rate for i in range(count))
        start += length
    return times


async def _one(
    client: aiohttp.ClientSession,
    instance: int,
    route: str,
    user: str,
    path: str,
    intended: float,
    t0: float,
    progress: Progress,
) -> Sample:
    sent = time.perf_counter() - t0
    try:
        async with client.get(path) as response:
            await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError):
        status = 0
    if route == "limited":
        progress.count(status)
    return Sample(instance, route, user, intended, sent, time.perf_counter() - t0 - intended, status)


async def _dispatch(
    client: aiohttp.ClientSession,
    instance: int,
    route: str,
    prefix: str,
    times: list[float],
    users: list[str],
    t0: float,
    progress: Progress,
) -> list[Sample]:
    tasks: list[asyncio.Task[Sample]] = []
    for i, at in enumerate(times):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        user = users[i % len(users)]
        tasks.append(asyncio.create_task(_one(client, instance, route, user, f"{prefix}/{user}", at, t0, progress)))
    return list(await asyncio.gather(*tasks))


async def drive(
    urls: list[str],
    times: list[float],
    floor_times: list[float],
    users: list[str],
    timeout: float = 10.0,
    progress_every: float | None = None,
) -> list[Sample]:
    """Run the schedule at every instance at once; every sample, limited and floor.

    With ``progress_every``, a line of running counts is printed that often.
    """
    clients = [
        aiohttp.ClientSession(
            base_url=url, timeout=aiohttp.ClientTimeout(total=timeout), connector=aiohttp.TCPConnector(limit=500)
        )
        for url in urls
    ]
    try:
        # Warm up each instance first (its store's connection pool opens on the first request,
        # the client's connections on theirs): the run measures the limiter, not start-up.
        # The warm-up user is not one of the run's users.
        for client in clients:
            for path in ("/items/warm-up", "/unlimited/warm-up") * 4:
                async with client.get(path) as response:
                    await response.read()
        t0 = time.perf_counter() + 0.2  # room to create the dispatchers before the first send
        progress = Progress()
        reporter = asyncio.create_task(_report_progress(progress, t0, progress_every)) if progress_every else None
        jobs = []
        for n, client in enumerate(clients):
            jobs.append(_dispatch(client, n, "limited", "/items", times, users, t0, progress))
            jobs.append(_dispatch(client, n, "floor", "/unlimited", floor_times, users, t0, progress))
        done = await asyncio.gather(*jobs)
        if reporter is not None:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
    finally:
        for client in clients:
            await client.close()
    return [s for samples in done for s in samples]
