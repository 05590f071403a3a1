"""The tour's four scenarios, each a stream of real ``POST /v1/check`` requests to the
service, recorded per second into the load test's ``ProfileStats`` (so its charts and
outputs serve the tour too), and told back in a few lines with the measured numbers:

- the partner endpoint (``items.list``, 1/2s): many callers, one key, each retrying when
  its refusal says; exactly one admitted in each 2 s window;
- the login (``auth.create_token``, 20/minute and 5/3s): bursts from one address, each
  stopped at 5 by 5/3s until 20/minute stops them altogether;
- a hot key (``tenant.requests``, 1000/minute): callers as fast as they go on one key,
  exactly the limit admitted, and the latency of each check;
- a flood of unique keys under a quota (``api.calls``): a new account every few
  requests, each admitted up to its plan, while the service's memory stays bounded.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ratekeeper.limit import Limit
from ratekeeper.loadtest.engine import LATE_AFTER, LATE_WARNING
from ratekeeper.loadtest.memory import rss_bytes
from ratekeeper.loadtest.stats import ProfileStats
from ratekeeper.tour.rules import FAILSAFE, HOT_LIMIT, QUOTA_MAX_KEYS, STORE_MAX_KEYS

__all__ = ["SCENARIOS", "Client", "Finding", "Pace", "Recorder", "Reply"]

BURST = 8
"""Login attempts sent at once in each burst."""
BURST_GAP = 3.25
"""Seconds between two login bursts: the 5/3s window has let the previous burst go."""
FAILED = 0
"""The status of a check that got no answer (the connection failed or timed out)."""
REFUSED = ("over", "shadow_over")
"""The ``outcome`` labels of ``ratekeeper_decisions_total`` that are refusals."""
FLOOD_REQUESTS = Limit.parse(FAILSAFE).count + 1
"""Requests per flooding account: its whole plan, and one more to see it refused."""


@dataclass(frozen=True, slots=True)
class Pace:
    """How long each scenario runs: the full tour takes about a minute, the quick one a
    few seconds (the same scenarios, fewer windows and bursts)."""

    partner_windows: int = 6
    partner_callers: int = 10
    login_bursts: int = 5
    hot_seconds: float = 5.0
    hot_rate: float = 600.0
    flood_seconds: float = 12.0
    flood_callers: int = 64

    @classmethod
    def quick(cls) -> Pace:
        return cls(partner_windows=2, login_bursts=2, hot_seconds=2.0, flood_seconds=1.5)


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer of ``/v1/check``, with when its request left and its answer came."""

    status: int
    body: dict[str, Any]
    sent: float
    done: float

    @property
    def allowed(self) -> bool:
        return self.status == 200

    @property
    def retry_after(self) -> float:
        value = self.body.get("retry_after")
        return math.inf if value is None else float(value)

    @property
    def denied_by(self) -> str | None:
        value = self.body.get("denied_by")
        return None if value is None else str(value)


class Recorder:
    """One scenario's requests, second by second from its start (``t0``)."""

    def __init__(self, name: str, expect: str | None = None) -> None:
        self.name = name
        self.expect = Limit.parse(expect) if expect else None
        self.stats = ProfileStats(name)
        self.t0 = time.monotonic()
        self.ended = self.t0

    def add(self, reply: Reply) -> None:
        stats = self.stats
        second = stats.second(int(reply.sent - self.t0))
        second.sent += 1
        if reply.allowed:
            second.allowed += 1
        elif reply.status == 429:
            second.denied += 1
        else:
            second.errors += 1
        latency = reply.done - reply.sent
        second.latencies_ms.append(latency * 1000)
        stats.histogram.record_value(max(1, round(latency * 1_000_000)))
        stats.statuses[str(reply.status)] += 1
        stats.first_send = reply.sent if stats.first_send is None else min(stats.first_send, reply.sent)
        stats.last_answer = reply.done if stats.last_answer is None else max(stats.last_answer, reply.done)
        stats.planned += 1
        self.ended = max(self.ended, reply.done)

    @property
    def seconds(self) -> float:
        return self.ended - self.t0

    def finish(self) -> None:
        """Every second of the scenario in its results, the quiet ones as zeros: a chart
        of one admission every 2 s then shows the seconds between."""
        for index in range(int(self.seconds) + 1):
            self.stats.second(index)


class Client:
    """Checks against the decision surface, metrics from the admin surface."""

    def __init__(self, session: aiohttp.ClientSession, http: str, admin: str) -> None:
        self.session = session
        self.check_url = f"{http}/v1/check"
        self.metrics_url = f"{admin}/metrics"

    async def check(self, recorder: Recorder, rule: str, key: str, due: float | None = None) -> Reply:
        """One check; its latency counts from ``due`` when given (when it was meant to leave)."""
        sent = time.monotonic() if due is None else due
        body: Any = {}
        try:
            async with self.session.post(self.check_url, json={"rule": rule, "key": key}) as response:
                body = await response.json(content_type=None)
                status = response.status
        except (aiohttp.ClientError, TimeoutError, ValueError):  # an error of the tour's: it then ends with 2
            status = FAILED
        reply = Reply(status, body if isinstance(body, dict) else {}, sent, time.monotonic())
        recorder.add(reply)
        return reply

    async def metrics(self) -> str:
        async with self.session.get(self.metrics_url) as response:
            response.raise_for_status()
            return await response.text()


@dataclass(slots=True)
class Finding:
    """What one scenario showed: a title, a few lines, the numbers behind them."""

    title: str
    lines: list[str]
    numbers: dict[str, Any]
    recorder: Recorder
    errors: int = field(init=False)

    def __post_init__(self) -> None:
        self.recorder.finish()
        self.errors = self.recorder.stats.totals()["errors"]

    def text(self) -> str:
        lines = [self.title, *(f"  {line}" for line in self.lines)]
        if self.errors:
            lines.append(f"  {self.errors} requests failed: see the service's log")
        return "\n".join(lines)


def _n(value: int) -> str:
    return f"{value:,}"


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


async def partner(client: Client, pace: Pace, pid: int) -> Finding:
    """Callers share one key of 1/2s; each one refused waits the ``retry_after`` it was
    told, so all come back when the window opens and one of them gets it."""
    recorder = Recorder("partner: items.list 1/2s", "1/2s")
    # Ends in the middle of a window, so the count of windows begun is not a matter of
    # milliseconds: the admissions come at the start of each window.
    end = recorder.t0 + 2 * pace.partner_windows - 1
    admitted: list[float] = []
    waits: list[float] = []

    async def caller() -> None:
        while time.monotonic() < end:
            reply = await client.check(recorder, "items.list", "partner")
            if reply.allowed:
                admitted.append(reply.sent)
                continue
            waits.append(reply.retry_after)
            if reply.done + reply.retry_after >= end:
                return
            await asyncio.sleep(reply.retry_after)

    await asyncio.gather(*(caller() for _ in range(pace.partner_callers)))
    admitted.sort()
    windows = math.floor((end - admitted[0]) / 2) + 1 if admitted else 0
    gaps = [b - a for a, b in itertools.pairwise(admitted)]
    totals = recorder.stats.totals()
    lines = [
        f"{end - recorder.t0:.1f} s, {windows} windows of 2 s: {totals['allowed']} admitted"
        + (f", one in each ({_range(gaps)} s apart)" if gaps else "")
        + f", {_n(totals['denied'])} refused",
        f"each refusal said when to retry (retry_after {_range(waits)} s, and Retry-After); "
        "the callers came back then and one of them got the next window",
    ]
    return Finding(
        f"Partner endpoint: items.list, 1/2s (gcra), one key, {pace.partner_callers} callers retrying when told",
        lines,
        {"windows": windows, "admitted": totals["allowed"], "refused": totals["denied"], "gaps_s": gaps},
        recorder,
    )


async def login(client: Client, pace: Pace, pid: int) -> Finding:
    """Bursts of login attempts from one address: 5/3s stops each at 5 until 20/minute,
    four bursts later, stops them all."""
    recorder = Recorder("login: auth.create_token 20/minute + 5/3s", "20/minute")
    bursts: list[dict[str, Any]] = []
    for b in range(pace.login_bursts):
        due = recorder.t0 + b * BURST_GAP
        if (delay := due - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        at = time.monotonic() - recorder.t0
        replies = await asyncio.gather(
            *(client.check(recorder, "auth.create_token", "203.0.113.7") for _ in range(BURST))
        )
        refused = [r for r in replies if r.status == 429]
        bursts.append(
            {
                "at_s": round(at, 2),
                "admitted": sum(r.allowed for r in replies),
                "refused": len(refused),
                "denied_by": sorted({r.denied_by for r in refused if r.denied_by}),
                "retry_after_s": round(max((r.retry_after for r in refused), default=0.0), 1),
            }
        )
    lines = []
    for i, burst in enumerate(bursts, 1):
        line = f"burst {i} at {burst['at_s']:.2f} s: {burst['admitted']} admitted"
        if burst["refused"]:
            by = " and ".join(burst["denied_by"])
            line += f", {burst['refused']} refused by {by} (retry in {burst['retry_after_s']:.1f} s)"
        lines.append(line)
    if len(bursts) < 5:
        lines.append("(the full tour sends five bursts: the fifth meets 20/minute)")
    return Finding(
        f"Login: auth.create_token, 20/minute and 5/3s (sliding_window_log), one client address, "
        f"a burst of {BURST} every {BURST_GAP:g} s",
        lines,
        {"bursts": bursts},
        recorder,
    )


_DECISIONS = re.compile(r"^ratekeeper_decisions_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.MULTILINE)
_LATENCY = re.compile(
    r"^ratekeeper_decision_latency_seconds_(?P<part>sum|count)\{[^}]*\} (?P<value>\S+)$", re.MULTILINE
)


def counted(metrics: str, rule: str) -> dict[str, int]:
    """The service's decisions of ``rule`` by outcome, from its ``/metrics``."""
    out: dict[str, int] = {}
    for match in _DECISIONS.finditer(metrics):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        if labels.get("rule") == rule:
            out[labels.get("outcome", "")] = out.get(labels.get("outcome", ""), 0) + int(float(match["value"]))
    return out


def decision_time(metrics: str) -> tuple[float, int]:
    """Seconds spent deciding, and decisions, over the service's life (its ``/metrics``)."""
    total = {"sum": 0.0, "count": 0.0}
    for match in _LATENCY.finditer(metrics):
        total[match["part"]] += float(match["value"])
    return total["sum"], int(total["count"])


async def hot_key(client: Client, pace: Pace, pid: int) -> Finding:
    """One key checked at a steady rate well past its limit: the limit exactly, whatever
    the concurrency; and what each check cost, at the caller and in the service. Each
    request leaves on its own schedule (open loop), its latency counted from when it was
    due, so a stall shows as latency rather than as fewer requests."""
    recorder = Recorder(f"hot key: tenant.requests {HOT_LIMIT}", HOT_LIMIT)
    limit = Limit.parse(HOT_LIMIT)
    count = max(round(pace.hot_rate * pace.hot_seconds), limit.count + limit.count // 5)
    before = decision_time(await client.metrics())
    pending: set[asyncio.Task[Reply]] = set()
    late = 0
    for i in range(count):
        due = recorder.t0 + i / pace.hot_rate
        if (delay := due - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        late += time.monotonic() - due > LATE_AFTER
        task = asyncio.create_task(client.check(recorder, "tenant.requests", "tenant-7", due=due))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    metrics = await client.metrics()
    after = decision_time(metrics)
    served = counted(metrics, "tenant.requests")
    totals = recorder.stats.totals()
    latency = recorder.stats.latency_ms()
    service_us = (after[0] - before[0]) / max(1, after[1] - before[1]) * 1_000_000
    exactly = "exactly " if totals["allowed"] == limit.count else ""
    lines = [
        f"{_n(totals['sent'])} checks in {recorder.seconds:.1f} s: "
        f"{exactly}{_n(totals['allowed'])} admitted, {_n(totals['denied'])} refused; the service counted "
        f"{_n(sum(n for outcome, n in served.items() if outcome not in REFUSED))} admitted too (/metrics)",
        f"latency at the caller: p50 {latency['p50_ms']:.2f} ms, p90 {latency['p90_ms']:.2f} ms, "
        f"p99 {latency['p99_ms']:.2f} ms, max {latency['max_ms']:.2f} ms; "
        f"the service's own decision: {service_us:.0f} µs on average (/metrics)",
    ]
    if late > LATE_WARNING * count:
        lines.append(
            f"{_n(late)} of {_n(count)} checks left more than {LATE_AFTER * 1000:g} ms late: this machine could "
            f"not keep {pace.hot_rate:,.0f} a second, and the latencies include that wait"
        )
    return Finding(
        f"Hot key: tenant.requests, {HOT_LIMIT} (sliding_window_log), one key, {pace.hot_rate:,.0f} checks a second",
        lines,
        {
            "sent": totals["sent"],
            "admitted": totals["allowed"],
            "refused": totals["denied"],
            "limit": limit.count,
            "late": late,
            "service_counted": served,
            "latency_ms": latency,
            "service_decision_us": round(service_us, 1),
        },
        recorder,
    )


async def flood(client: Client, pace: Pace, pid: int) -> Finding:
    """A new account every few requests, each meeting its plan; the store and the quota
    keep a bounded number of keys, so the service's memory stops growing."""
    recorder = Recorder("flood: api.calls, quota")
    end = recorder.t0 + pace.flood_seconds
    per_account: list[int] = []
    rss: list[tuple[float, int]] = []
    accounts = 0

    def sample() -> None:
        value = rss_bytes(pid)
        if value is not None:
            rss.append((time.monotonic() - recorder.t0, value))

    async def caller() -> None:
        nonlocal accounts
        while time.monotonic() < end:
            accounts += 1
            account = f"flood-{accounts}@example.com"
            admitted = 0
            for _ in range(FLOOD_REQUESTS):
                admitted += (await client.check(recorder, "api.calls", account)).allowed
            per_account.append(admitted)

    async def sampler() -> None:
        while True:
            sample()
            await asyncio.sleep(pace.flood_seconds / 8)

    sampling = asyncio.create_task(sampler())
    try:
        await asyncio.gather(*(caller() for _ in range(pace.flood_callers)))
    finally:
        sampling.cancel()
    sample()
    totals = recorder.stats.totals()
    plan = Limit.parse(FAILSAFE).count
    each = "every account admitted exactly" if set(per_account) == {plan} else "accounts admitted up to"
    lines = [
        f"{_n(len(per_account))} accounts, {_n(totals['sent'])} checks in {recorder.seconds:.1f} s: "
        f"{_n(totals['allowed'])} admitted, {_n(totals['denied'])} refused; {each} {plan}, its plan ({FAILSAFE})",
    ]
    if rss:
        mib = [b / 2**20 for _, b in rss]
        quarter = mib[min(len(mib) - 1, max(1, len(mib) // 4))]
        lines.append(
            f"service memory (RSS): {mib[0]:.1f} MiB at the start, {quarter:.1f} MiB a quarter in, "
            f"{mib[-1]:.1f} MiB at the end: the store keeps at most {_n(STORE_MAX_KEYS)} keys a rule and the "
            f"quota {_n(QUOTA_MAX_KEYS)} plans, the least recently used dropped first"
        )
    return Finding(
        f"Flood: api.calls under a quota (unknown accounts get {FAILSAFE}), {pace.flood_callers} callers, "
        f"a new account every {FLOOD_REQUESTS} requests",
        lines,
        {
            "accounts": len(per_account),
            "admitted": totals["allowed"],
            "refused": totals["denied"],
            "admitted_per_account": sorted(set(per_account)),
            "rss_bytes": [b for _, b in rss],
        },
        recorder,
    )


Scenario = Callable[[Client, Pace, int], Any]
SCENARIOS: tuple[Scenario, ...] = (partner, login, hot_key, flood)
"""In the order the tour runs them, one after the other."""
