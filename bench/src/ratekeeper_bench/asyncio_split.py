"""Where an asyncio decision's time goes on Redis: the client's CPU, the server's, asyncio's floor.

The asyncio cells of ``bench redis`` report decisions/s. A rate alone does not say what
bounds it, so this part measures, for every ratekeeper algorithm with ``tasks`` tasks on
one ``AsyncLimiter`` (coalescing on, as shipped), in the hot-key and many-keys scenarios:

- the client's CPU per decision: ``time.process_time`` over the cell, over the decisions
  (this process: the limiter, redis-py, asyncio; the server runs in its own process);
- the server's CPU per decision: the change of ``INFO commandstats`` over the cell (every
  script command: ``EVALSHA``, ``FCALL`` and their read-only forms), over the decisions,
  and how many decisions one script call carried;

and, with no server at all, two floors of the client alone:

- **asyncio**: ``tasks`` tasks, each awaiting a future that one ``call_soon`` callback
  answers for everyone waiting: what asyncio itself costs per awaited decision;
- **coalescer + wire**: the same through ratekeeper's ``AsyncCoalescer``, the call being
  the wire format's ``encode_redis`` and ``decode`` of the batch around a ``sleep(0)``: the
  client's share before redis-py and the socket.

One process decides at most 1 / (client µs) decisions per second however fast the
server is; on a machine whose cores the client and the server share, the two add up.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ratekeeper_bench import report
from ratekeeper_bench.latency import time_tasks

__all__ = ["FloorCell", "SplitCell", "measure_floors", "measure_split", "render_split", "script_usec"]

SCRIPT_COMMANDS = ("evalsha", "evalsha_ro", "eval", "eval_ro", "fcall", "fcall_ro")
"""The commands a decision runs as (``INFO commandstats`` names them ``cmdstat_<name>``)."""


@dataclass(frozen=True, slots=True)
class SplitCell:
    """One algorithm in one scenario: rate, and where each decision's CPU went."""

    algorithm: str
    scenario: str
    rate: float
    client_us: float
    """Client CPU µs per decision (this process)."""
    server_us: float
    """Redis CPU µs per decision (script commands only)."""
    per_call: float
    """Decisions per script call (coalescing's batches)."""
    errors: int


@dataclass(frozen=True, slots=True)
class FloorCell:
    """A client-only floor: decisions/s and CPU µs per decision with no server."""

    subject: str
    rate: float
    client_us: float


def script_usec(client: Any) -> tuple[int, int]:
    """(calls, µs) of every script command so far, from ``INFO commandstats``."""
    stats = client.info("commandstats")
    calls = usec = 0
    for name in SCRIPT_COMMANDS:
        entry = stats.get(f"cmdstat_{name}", {})
        calls += int(entry.get("calls", 0))
        usec += int(entry.get("usec", 0))
    return calls, usec


async def _split_cell(
    url: str, prefix: str, algorithm: str, scenario: str, keys: Sequence[str], duration: float, tasks: int
) -> SplitCell:
    import redis

    from ratekeeper import AsyncLimiter, Rule

    limiter = AsyncLimiter(url, prefix=prefix)
    rule = Rule("split", ["1000000000/1s"], algorithm=algorithm)
    acquire = limiter.try_acquire
    stats: Any = redis.Redis.from_url(url)
    try:

        async def decide(key: str) -> bool:
            return (await acquire(rule, key)).allowed

        await time_tasks(decide, itertools.cycle(keys[:1000]), min(duration, 0.3), tasks)  # warm: script, connections
        calls0, usec0 = script_usec(stats)
        sample = await time_tasks(decide, itertools.cycle(keys), duration, tasks)
        calls1, usec1 = script_usec(stats)
    finally:
        stats.close()
        await limiter.aclose()
    decisions = max(sample.calls, 1)
    calls = calls1 - calls0
    return SplitCell(
        algorithm,
        scenario,
        sample.rate,
        sample.cpu_seconds * 1e6 / decisions,
        (usec1 - usec0) / decisions,
        decisions / calls if calls > 0 else 0.0,
        sample.errors,
    )


def measure_split(
    url: str,
    prefix: str,
    algorithms: Sequence[str],
    scenarios: dict[str, Sequence[str]],
    duration: float,
    tasks: int,
    note: Callable[[str], None] = lambda _: None,
) -> list[SplitCell]:
    """Every (algorithm, scenario) cell on the Redis at ``url``, each under ``prefix`` + a
    number (the caller deletes the prefix); ``scenarios`` maps a name to its keys."""
    cells: list[SplitCell] = []
    for i, (scenario, keys) in enumerate(scenarios.items()):
        for j, algorithm in enumerate(algorithms):
            cell = asyncio.run(_split_cell(url, f"{prefix}{i}.{j}:", algorithm, scenario, keys, duration, tasks))
            cells.append(cell)
            note(
                f"split {algorithm} {scenario}: {report.format_rate(cell.rate)}/s, client {cell.client_us:.1f} µs, "
                f"Redis {cell.server_us:.1f} µs per decision"
            )
    return cells


async def _floor(submit: Callable[[], Awaitable[Any]], duration: float, tasks: int) -> tuple[float, float]:
    async def decide(_: str) -> bool:
        await submit()
        return True

    sample = await time_tasks(decide, itertools.repeat("k"), duration, tasks)
    return sample.rate, sample.cpu_seconds * 1e6 / max(sample.calls, 1)


async def _asyncio_floor(duration: float, tasks: int) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future[bool]] = []

    def answer() -> None:
        batch = waiting[:]
        waiting.clear()
        for future in batch:
            future.set_result(True)

    async def submit() -> bool:
        future: asyncio.Future[bool] = loop.create_future()
        if not waiting:
            loop.call_soon(answer)
        waiting.append(future)
        return await future

    return await _floor(submit, duration, tasks)


async def _coalescer_floor(duration: float, tasks: int) -> tuple[float, float]:
    from ratekeeper import Rule
    from ratekeeper.op import Op
    from ratekeeper.stores import wire
    from ratekeeper.stores.coalescing import Coalescer
    from ratekeeper.stores.coalescing_asyncio import AsyncCoalescer

    plan = Rule("split", ["1000000000/1s"], algorithm="gcra").plan
    reply = [1, -1, 0, 0, 999_999_999, 1]  # one admitted gcra decision in the wire format

    async def run(ops: Sequence[Op], now: int | None) -> list[Any]:
        wire.encode_redis(ops, "split:", now)
        await asyncio.sleep(0)
        return wire.decode(ops, reply * len(ops))

    coalescer: AsyncCoalescer[Op, Any] = AsyncCoalescer(
        Coalescer(2, 100), run, lambda _: False, 30.0, "split", "one loop"
    )
    op = Op.decide(plan, "k", 1)
    return await _floor(lambda: coalescer.submit(op, None), duration, tasks)


def measure_floors(duration: float, tasks: int) -> list[FloorCell]:
    """The client-only floors (see the module docstring)."""
    out = []
    for subject, floor in (
        ("asyncio: a future per decision, answered by one callback", _asyncio_floor),
        ("ratekeeper's coalescer + wire encode/decode, no server", _coalescer_floor),
    ):
        rate, client_us = asyncio.run(floor(duration, tasks))
        out.append(FloorCell(subject, rate, client_us))
    return out


def render_split(cells: Sequence[SplitCell], floors: Sequence[FloorCell], tasks: int, server: str) -> list[str]:
    """The Markdown of this part."""
    out = [
        f"### asyncio, {tasks} tasks: where a decision's time goes (on {server})",
        "",
        "Client µs: this process's CPU (`time.process_time`) over the cell, per decision. Redis µs: the "
        "change of `INFO commandstats` (script commands) per decision. Per call: decisions per script call "
        "(coalescing). One process decides at most 1 / client µs decisions per second.",
        "",
        "| algorithm | scenario | decisions/s | client µs | Redis µs | per call | bound by the client /s | errors |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in cells:
        bound = 1e6 / c.client_us if c.client_us > 0 else 0.0
        out.append(
            f"| {c.algorithm} | {c.scenario} | {report.format_rate(c.rate)} | {c.client_us:.2f} | "
            f"{c.server_us:.2f} | {c.per_call:.1f} | {report.format_rate(bound)} | {c.errors} |"
        )
    out += ["", "| client-only floor | decisions/s | client µs |", "| --- | ---: | ---: |"]
    out += [f"| {f.subject} | {report.format_rate(f.rate)} | {f.client_us:.2f} |" for f in floors]
    out.append("")
    return out
