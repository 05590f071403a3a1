"""The open-loop engine: each profile sends on its own schedule whatever the answers'
latency, as wrk2 and oha do. A request's latency runs from when it was *meant* to leave,
so a stalled server shows as latency rather than as fewer requests (coordinated
omission); a send the event loop could not start on time is counted ``late``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from ratekeeper.loadtest.memory import RssSampler
from ratekeeper.loadtest.profiles import Plan, Profile
from ratekeeper.loadtest.schedule import send_offsets
from ratekeeper.loadtest.stats import ProfileStats

__all__ = ["LATE_AFTER", "RunResult", "run_plan"]

LATE_AFTER = 0.010
"""Seconds after its due time past which a send counts as late."""
LATE_WARNING = 0.05
"""The share of late sends above which the run warns that the machine could not keep a
rate (a few late sends are the jitter of a busy machine, not a rate it cannot keep)."""


@dataclass(slots=True)
class RunResult:
    plan: Plan
    stats: dict[str, ProfileStats]
    started: float
    """Wall-clock time (epoch seconds) of t0."""
    elapsed: float
    rss: list[tuple[float, int]] = field(default_factory=list)
    """(seconds since t0, bytes) of the server, when its pid was known."""
    warnings: list[str] = field(default_factory=list)


Tick = Callable[[float, dict[str, ProfileStats]], None]


async def _send(
    session: aiohttp.ClientSession, url: str, profile: Profile, n: int, due: float, index: int, stats: ProfileStats
) -> None:
    headers = {k: profile.render(v, n) for k, v in profile.headers.items()}
    status: str
    try:
        async with session.request(profile.method, url.replace("{n}", str(n)), headers=headers) as response:
            await response.read()
            status = str(response.status)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        status = type(exc).__name__
    done = time.monotonic()
    second = stats.second(index)  # the send's own second, so each row's counts add up
    stats.statuses[status] += 1
    if status == "429":
        second.denied += 1
    elif status.isdigit() and int(status) < 400:
        second.allowed += 1
    else:
        second.errors += 1
    latency = done - due
    second.latencies_ms.append(latency * 1000)
    stats.histogram.record_value(max(1, round(latency * 1_000_000)))
    stats.last_answer = done if stats.last_answer is None else max(stats.last_answer, done)


async def _drive(
    session: aiohttp.ClientSession, target: str, profile: Profile, t0: float, stats: ProfileStats, seed: int
) -> None:
    url = target + profile.path
    pending: set[asyncio.Task[None]] = set()
    for n, offset in enumerate(send_offsets(profile, seed)):
        due = t0 + offset
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.monotonic()
        index = int(offset)
        second = stats.second(index)
        second.sent += 1
        if now - due > LATE_AFTER:
            second.late += 1
        if stats.first_send is None:
            stats.first_send = now
        task = asyncio.create_task(_send(session, url, profile, n, due, index, stats))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)


async def _ticker(t0: float, stats: dict[str, ProfileStats], tick: Tick) -> None:
    while True:
        await asyncio.sleep(0.25)
        tick(time.monotonic() - t0, stats)


async def run_plan(
    plan: Plan, *, tick: Tick | None = None, pid: int | None = None, seed: int = 0, connections: int = 1000
) -> RunResult:
    """Run every profile of ``plan`` at once; ends at most ``plan.timeout`` seconds after the
    last scheduled send (each request is bounded by it)."""
    stats = {p.name: ProfileStats(p.name) for p in plan.profiles}
    for p in plan.profiles:
        stats[p.name].planned = sum(1 for _ in send_offsets(p, seed))
    timeout = aiohttp.ClientTimeout(total=plan.timeout)
    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    sampler = RssSampler(pid) if pid is not None else None
    started = time.time()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        t0 = time.monotonic() + 0.05
        if sampler is not None:
            sampler.start(t0)
        ticker = asyncio.create_task(_ticker(t0, stats, tick)) if tick is not None else None
        try:
            await asyncio.gather(*(_drive(session, plan.target, p, t0, stats[p.name], seed) for p in plan.profiles))
        finally:
            if ticker is not None:
                ticker.cancel()
            if sampler is not None:
                await sampler.stop()
        elapsed = time.monotonic() - t0
    if tick is not None:
        tick(elapsed, stats)
    result = RunResult(plan, stats, started, elapsed, sampler.samples if sampler else [])
    result.warnings.extend(_rate_warnings(plan, stats))
    return result


def _rate_warnings(plan: Plan, stats: dict[str, ProfileStats]) -> list[str]:
    out = []
    for p in plan.profiles:
        totals = stats[p.name].totals()
        if totals["sent"] and totals["late"] / totals["sent"] > LATE_WARNING:
            out.append(
                f"{p.name}: {totals['late']} of {totals['sent']} sends left more than {LATE_AFTER * 1000:g} ms late: "
                "this machine could not keep the profile's rate (the latencies include the wait)"
            )
    return out
