"""``ratekeeper bench web``: the rate-limiting middleware against the bare app and its peers, under wrk.

One run, one machine, the same settings for every case. Three stacks, each measured on
its own: Starlette under uvicorn (one process, httptools, uvloop, no access log), Flask
and Django under gunicorn (one gthread worker with one thread, so connections are kept
alive as uvicorn keeps them; no access log). In each stack the same endpoint
(``GET /bench`` answering ``ok``) is served

- bare: the floor every ratio is taken against;
- behind ratekeeper's middleware (ASGI ``RateLimitMiddleware`` on Starlette, WSGI
  ``WSGIRateLimitMiddleware`` on Flask, the Django middleware on Django, or the WSGI one
  around Django's app when there is none) with one ``Rule`` on ``memory://`` and on
  Redis (``--redis-url``, a key prefix of the run's own, deleted at the end);
- behind the stack's peer: slowapi (Starlette), flask-limiter (Flask), django-ratelimit
  (Django), each on its own in-memory storage;

first under a limit of 1,000,000 per second (nothing is denied: the cost of deciding),
then under 1 per hour, spent before timing (nearly every answer is a 429: the cost of
refusing). Every request comes from 127.0.0.1, so every limiter decides for one key.

How it is loaded: wrk with ``--threads`` threads and ``--connections`` connections for
``--duration`` whole seconds per round. All servers of a stack are started together and
loaded one at a time; ``--rounds`` rounds go through the stack's cases in turn, so a
change in the machine's load falls on every case alike, and each case reports its median
round. With two CPUs or more the servers are pinned to CPU 0 and wrk to CPU 1
(``taskset``; ``--no-pin`` leaves placement to the kernel). Each round also reads the
server's CPU time: well under 100 % means another process took its CPU (or wrk could not
keep it busy), and the report says so.

Before a case is timed it is probed: three requests must answer 200 (allowed cases) or
429 (denied ones); a case that does not is a failure, not a row. Reported per case:
requests/s, wrk's p50 and p99 latency, the share of non-2xx answers, the server's CPU
share, and requests/s over the same stack's bare app; then the targets (``TARGETS``: on
Starlette at least 1.3 times slowapi allowed and denied, 0.65 of the bare app on memory and
0.6 on Redis; at least 1.2 times django-ratelimit and 1.4 times flask-limiter), each "met"
or "not met".

The CLI calls ``add_arguments(parser)`` and ``run(args)``; ``main(argv)`` runs it alone
(``python -m ratekeeper_bench.web``). Progress goes to standard error (one line per case
and round), the tables to standard output (and to ``--markdown PATH``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import platform
import resource
import secrets
import shutil
import sys
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ratekeeper_bench import options, report
from ratekeeper_bench.environment import redis_reachable, store_url, versions
from ratekeeper_bench.options import (
    add_load_options,
    add_server_run_options,
    choose,
    count,
    describe,
    finish,
)
from ratekeeper_bench.web_apps import AppConfig
from ratekeeper_bench.web_apps.django_app import has_django_middleware
from ratekeeper_bench.web_apps.servers import FRAMEWORKS, Server, ServerError
from ratekeeper_bench.web_apps.wrk import WrkError, WrkResult, find_wrk, run_wrk, wrk_version

__all__ = [
    "BARE_TARGETS",
    "CASES",
    "DEFAULT_DURATION",
    "DEFAULT_ROUNDS",
    "DEFAULT_URL",
    "PEER_TARGETS",
    "Case",
    "CaseResult",
    "Failure",
    "Settings",
    "Target",
    "WebBenchResult",
    "add_arguments",
    "bench_from_args",
    "main",
    "run",
    "run_web_bench",
    "settings_from_args",
]

DEFAULT_DURATION = 3
DEFAULT_ROUNDS = 3
DEFAULT_THREADS = 1
DEFAULT_CONNECTIONS = 32
DEFAULT_URL = "redis://127.0.0.1:6379/0"
QUICK_DURATION = 1
QUICK_ROUNDS = 1
WARM_UP_SECONDS = 1
"""wrk seconds per case before the rounds (not in ``--quick``): imports, scripts, caches."""

ALLOWED = (1_000_000, 1)
"""1,000,000 per second: nothing is denied at these rates, every request is decided."""
DENIED = (1, 3600)
"""1 per hour: spent by the probe, so every timed request is refused."""

PEERS = {"starlette": "slowapi", "flask": "flask-limiter", "django": "django-ratelimit"}

BARE_TARGETS = {"starlette": {"memory": 0.65, "redis": 0.6}}
"""Per stack, ratekeeper's requests/s on each store over the bare app's, at least."""
PEER_TARGETS = {"starlette": 1.3, "django": 1.2, "flask": 1.4}
"""Per stack, ratekeeper's requests/s on memory over its peer's, at least, allowed and denied alike."""


@dataclass(frozen=True, slots=True)
class Case:
    """One server of one stack: bare, ratekeeper on a store, or a peer; allowed or denied."""

    stack: str
    variant: str
    """``bare``, ``ratekeeper`` or the peer's name (``AppConfig.variant``)."""
    store: str = ""
    """ratekeeper's store, ``memory`` or ``redis``; empty for the others."""
    denied: bool = False

    @property
    def label(self) -> str:
        name = f"{self.variant} {self.store}" if self.store else self.variant
        return f"{name}, denied" if self.denied else name

    @property
    def needs(self) -> tuple[str, ...]:
        """``module`` or ``module:attribute`` that must import for the case to run."""
        framework = {"starlette": ("starlette", "uvicorn", "httptools", "uvloop")}.get(
            self.stack, (self.stack, "gunicorn")
        )
        if self.variant == "bare":
            return framework
        if self.variant == "ratekeeper":
            middleware = "RateLimitMiddleware" if self.stack == "starlette" else "WSGIRateLimitMiddleware"
            if self.stack == "django" and has_django_middleware():
                return (*framework, "ratekeeper.web.django:RateLimitMiddleware")
            return (*framework, f"ratekeeper.web:{middleware}")
        return (*framework, self.variant.replace("-", "_"))


def _cases() -> tuple[Case, ...]:
    cases: list[Case] = []
    for stack, peer in PEERS.items():
        cases += [
            Case(stack, "bare"),
            Case(stack, "ratekeeper", "memory"),
            Case(stack, "ratekeeper", "redis"),
            Case(stack, peer),
            Case(stack, "ratekeeper", "memory", denied=True),
            Case(stack, "ratekeeper", "redis", denied=True),
            Case(stack, peer, denied=True),
        ]
    return tuple(cases)


CASES = _cases()


@dataclass(frozen=True, slots=True)
class Settings:
    """What one run does: how long and how hard each case is loaded, and where."""

    duration: int = DEFAULT_DURATION
    rounds: int = DEFAULT_ROUNDS
    threads: int = DEFAULT_THREADS
    connections: int = DEFAULT_CONNECTIONS
    warm_up: bool = True
    pin: bool = True
    """Server on CPU 0, wrk on CPU 1 (only with two CPUs or more and ``taskset``)."""
    stacks: tuple[str, ...] = tuple(PEERS)
    redis_url: str = DEFAULT_URL
    prefix: str = ""
    """Redis key prefix of the run (made up when empty); nothing is left under it."""


@dataclass(frozen=True, slots=True)
class Round:
    """One wrk run against one case, and the CPU shares of the server and of wrk meanwhile."""

    wrk: WrkResult
    server_cpu: float
    wrk_cpu: float
    others_cpu: float | None = None
    """Share of the server's CPU (CPU 0, when pinned) that other processes used during the round."""

    @property
    def cpu_rate(self) -> float:
        """Requests per second of the server's CPU time: the inverse of its CPU cost per request.

        Steadier than requests/s on a shared machine (time taken by other processes is
        not counted), but for a server that also waits (on Redis) it is a cost, not a
        rate the server could reach.
        """
        return self.wrk.rate / self.server_cpu if self.server_cpu > 0 else 0.0


@dataclass(frozen=True, slots=True)
class CaseResult:
    """A case's rounds; its figures are those of its median round (by requests/s)."""

    case: Case
    probe: tuple[int, ...]
    rounds: tuple[Round, ...]

    @property
    def median(self) -> Round:
        return report.median_by(self.rounds, lambda r: r.wrk.rate)

    @property
    def rate(self) -> float:
        return self.median.wrk.rate

    @property
    def cpu_rate(self) -> float:
        """The median over the rounds of ``Round.cpu_rate``."""
        return report.median_by([r.cpu_rate for r in self.rounds], float)


@dataclass(frozen=True, slots=True)
class Target:
    """A target of the run: ratekeeper's figure over the bare app's or the peer's, at least
    ``threshold``, by requests/s and by requests per server CPU-second."""

    what: str
    ratio: float | None
    cpu_ratio: float | None
    threshold: float

    def met(self, ratio: float | None) -> bool | None:
        return None if ratio is None else ratio >= self.threshold


@dataclass(frozen=True, slots=True)
class Failure:
    case: Case
    error: str


@dataclass(slots=True)
class WebBenchResult:
    """Everything one run measured, the ratios derived from it, and the machine's state."""

    settings: Settings
    pinned: bool
    machine: str
    wrk: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    results: list[CaseResult] = field(default_factory=list)
    skipped: list[tuple[Case, str]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    redis_keys_deleted: int = 0
    django_middleware: bool = True
    """False: ``ratekeeper.web.django`` is missing and the WSGI middleware wraps Django's app."""

    def result(self, case: Case) -> CaseResult | None:
        return next((r for r in self.results if r.case == case), None)

    def ratio_to_bare(self, result: CaseResult) -> float | None:
        """``result``'s requests/s over its stack's bare app's (None when bare did not run)."""
        bare = self.result(Case(result.case.stack, "bare"))
        if bare is None or bare.rate <= 0:
            return None
        return result.rate / bare.rate

    def cpu_ratio_to_bare(self, result: CaseResult) -> float | None:
        """``result``'s requests per server CPU-second over its stack's bare app's."""
        bare = self.result(Case(result.case.stack, "bare"))
        if bare is None or bare.cpu_rate <= 0:
            return None
        return result.cpu_rate / bare.cpu_rate

    def targets(self) -> list[Target]:
        """Each target of the brief; a ratio is None when a case it needs did not run."""
        out: list[Target] = []

        def ratios(ours: CaseResult | None, other: CaseResult | None) -> tuple[float | None, float | None]:
            if ours is None or other is None or other.rate <= 0 or other.cpu_rate <= 0:
                return None, None
            return ours.rate / other.rate, ours.cpu_rate / other.cpu_rate

        for stack in self.settings.stacks:
            bare = self.result(Case(stack, "bare"))
            for store, threshold in BARE_TARGETS.get(stack, {}).items():
                ours = self.result(Case(stack, "ratekeeper", store))
                out.append(Target(f"{stack}: ratekeeper {store} / bare", *ratios(ours, bare), threshold))
            for denied in (False, True):
                peer = self.result(Case(stack, PEERS[stack], denied=denied))
                ours = self.result(Case(stack, "ratekeeper", "memory", denied=denied))
                what = f"{stack}: ratekeeper memory / {PEERS[stack]}" + (", both denied" if denied else "")
                out.append(Target(what, *ratios(ours, peer), PEER_TARGETS[stack]))
        return out

    def to_markdown(self) -> str:
        return render_markdown(self)


# -- measuring ----------------------------------------------------------------------------


def _missing(case: Case) -> str | None:
    """Why ``case`` cannot run here (a module or name that does not import), or None."""
    for need in case.needs:
        module, _, attribute = need.partition(":")
        try:
            imported = importlib.import_module(module)
            if attribute:
                getattr(imported, attribute)
        except Exception as exc:  # noqa: BLE001 - any failure to import means: not measurable here
            return f"cannot import {need}: {describe(exc)}"
    return None


def _config(case: Case, settings: Settings, run_id: str, prefix: str) -> AppConfig:
    limit, period = DENIED if case.denied else ALLOWED
    rule = f"bench-web-{run_id}-{case.stack}-{case.store or case.variant}-{'denied' if case.denied else 'allowed'}"
    return AppConfig(case.variant, limit, period, store_url(case.store, settings.redis_url, prefix), rule)


def _cpu_ticks(cpu: int) -> tuple[int, int]:
    """(busy, total) clock ticks of one CPU since boot, from ``/proc/stat``; (0, 0) if unreadable."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith(f"cpu{cpu} "):
                    ticks = [int(x) for x in line.split()[1:9]]
                    idle = ticks[3] + ticks[4]  # idle, iowait
                    return sum(ticks) - idle, sum(ticks)
    except (OSError, ValueError):
        pass
    return 0, 0


def _round(server: Server, wrk: str, settings: Settings, seconds: int, pinned: bool) -> Round:
    cpu_before = server.cpu_seconds()
    busy_before, total_before = _cpu_ticks(0)
    # wrk is the only child that ends during the run, so the children's usage is wrk's.
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run_wrk(
        wrk,
        server.url,
        seconds=seconds,
        threads=settings.threads,
        connections=settings.connections,
        cpu=1 if pinned else None,
    )
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_seconds = server.cpu_seconds() - cpu_before
    busy, total = _cpu_ticks(0)
    if result.seconds <= 0:
        return Round(result, 0.0, 0.0)
    wrk_seconds = children.ru_utime + children.ru_stime - children_before.ru_utime - children_before.ru_stime
    others = None
    if pinned and total > total_before:
        # CPU 0's busy share over the round, less the server's own share: what others took from it.
        busy_share = (busy - busy_before) / (total - total_before)
        others = max(0.0, busy_share - server_seconds / result.seconds)
    return Round(result, server_seconds / result.seconds, wrk_seconds / result.seconds, others)


def _summary(r: Round) -> str:
    w = r.wrk
    text = (
        f"{report.format_rate(w.rate)} req/s, p50 {w.p50_us / 1000:.2f} ms, p99 {w.p99_us / 1000:.2f} ms, "
        f"server CPU {r.server_cpu:.0%}, wrk CPU {r.wrk_cpu:.0%}"
    )
    if r.others_cpu is not None:
        text += f", others on the server's CPU {r.others_cpu:.0%}"
    if w.non_2xx:
        text += f", non-2xx {report.format_fraction(w.non_2xx_fraction)}"
    if w.socket_errors:
        text += f", {w.socket_errors} socket errors"
    return text


def _run_stack(
    stack: str,
    cases: Sequence[Case],
    settings: Settings,
    wrk: str,
    pinned: bool,
    run_id: str,
    prefix: str,
    log_dir: Path,
    result: WebBenchResult,
    bar: report.Progress,
) -> None:
    """Start every server of ``stack``, probe them, warm them, then run the rounds in turn."""
    framework = FRAMEWORKS[stack]
    with ExitStack() as stop:
        servers: dict[Case, Server] = {}
        for case in cases:
            server = Server(framework, _config(case, settings, run_id, prefix), log_dir, cpu=0 if pinned else None)
            server.start()
            stop.callback(server.stop)
            servers[case] = server
        probes: dict[Case, tuple[int, ...]] = {}
        for case, server in servers.items():
            try:
                server.wait_ready()
                probe = server.probe()
                expected = 429 if case.denied else 200
                if any(status != expected for status in probe):
                    raise ServerError(f"answered {probe} to the probe where {expected} was expected")
                if settings.warm_up:
                    run_wrk(wrk, server.url, seconds=WARM_UP_SECONDS, threads=settings.threads,
                            connections=settings.connections, cpu=1 if pinned else None)  # fmt: skip
                probes[case] = probe
            except (ServerError, WrkError, OSError) as exc:
                result.failures.append(Failure(case, describe(exc)))
                bar.note(f"{stack} {case.label}: failed: {describe(exc)}")
                for _ in range(settings.rounds):
                    bar.finish(f"{stack} {case.label}", "failed")
        rounds: dict[Case, list[Round]] = {case: [] for case in probes}
        for n in range(1, settings.rounds + 1):
            for case in list(rounds):
                label = f"{stack} {case.label}, round {n}/{settings.rounds}"
                bar.start(label)
                try:
                    measured = _round(servers[case], wrk, settings, settings.duration, pinned)
                except (WrkError, OSError) as exc:
                    result.failures.append(Failure(case, describe(exc)))
                    bar.note(f"{label}: failed: {describe(exc)}")
                    for _ in range(n, settings.rounds + 1):
                        bar.finish(label, "failed")
                    del rounds[case]
                    continue
                rounds[case].append(measured)
                bar.finish(label, _summary(measured))
        result.results += [CaseResult(case, probes[case], tuple(rs)) for case, rs in rounds.items()]


def run_web_bench(
    settings: Settings, out: TextIO, progress: bool, progress_stream: TextIO | None = None
) -> WebBenchResult:
    """Run every case of the chosen stacks; the Markdown report goes to ``out``.

    Raises ``RuntimeError`` when wrk is not installed. A case that cannot run here (a
    framework, peer or ratekeeper's middleware that does not import; Redis down) is
    listed as skipped; one that fails (no start, wrong probe, wrk error) as a failure.
    """
    if settings.duration < 1 or settings.rounds < 1:
        raise ValueError("duration (whole seconds) and rounds must be at least 1")
    wrk = find_wrk()
    if wrk is None:
        raise RuntimeError("wrk is not installed (Debian: apt-get install wrk)")
    pinned = settings.pin and (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
    run_id = secrets.token_hex(4)
    prefix = settings.prefix or f"rk-bench-web-{run_id}:"
    result = WebBenchResult(
        settings=settings,
        pinned=pinned,
        machine=f"Python {platform.python_version()} on {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs",
        wrk=wrk_version(wrk),
        versions=versions(_VERSIONS),
        load_before=os.getloadavg(),
        django_middleware=has_django_middleware(),
    )
    redis_down = redis_reachable(settings.redis_url)
    chosen: list[Case] = []
    for case in CASES:
        if case.stack not in settings.stacks:
            continue
        reason = _missing(case) or (redis_down if case.store == "redis" else None)
        if reason is None:
            chosen.append(case)
        else:
            result.skipped.append((case, reason))
    bar = report.Progress(
        progress_stream if progress_stream is not None else sys.stderr,
        len(chosen) * settings.rounds,
        enabled=progress,
    )
    for case, reason in result.skipped:
        bar.note(f"skipping {case.stack} {case.label}: {reason}")
    try:
        with tempfile.TemporaryDirectory(prefix="rk-bench-web-") as tmp:
            for stack in settings.stacks:
                cases = [c for c in chosen if c.stack == stack]
                if cases:
                    _run_stack(stack, cases, settings, wrk, pinned, run_id, prefix, Path(tmp), result, bar)
    finally:
        bar.close()
        if any(c.store == "redis" for c in chosen):
            from ratekeeper_bench.redis import cleanup

            result.redis_keys_deleted = cleanup(settings.redis_url, prefix)
        result.load_after = os.getloadavg()
    out.write(result.to_markdown())
    out.flush()
    return result


# -- report -------------------------------------------------------------------------------


_WHAT_RUNS = (
    "Starlette ratekeeper: `Starlette(routes, middleware=[Middleware(RateLimitMiddleware, rules=[HttpRule(Rule(name, "
    '[limit]), key=KeyTemplate.parse("{client_ip}"))], store=URL)])`; GCRA (the default algorithm); the '
    "middleware's default headers (`RateLimit-Policy`, `RateLimit`, `X-RateLimit-*`) on every answer.",
    'Starlette slowapi: the endpoint under `@limiter.limit("1000000 per 1 second")`, `Limiter(key_func='
    'get_remote_address, storage_uri="memory://")`, its `_rate_limit_exceeded_handler` for 429; limits\' fixed '
    "window; no headers (slowapi's default).",
    "Flask ratekeeper: `app.wsgi_app = WSGIRateLimitMiddleware(app.wsgi_app, rules=..., store=URL)`, the same rule.",
    'Flask flask-limiter: the endpoint under `@limiter.limit("1000000 per 1 second")`, `Limiter(get_remote_address, '
    'app=app, storage_uri="memory://")`; limits\' fixed window; no headers (its default).',
    "Django ratekeeper: `ratekeeper.web.django.RateLimitMiddleware` in `MIDDLEWARE`, `settings.RATEKEEPER = "
    '{"rules": ..., "store": URL}`, the same rule. Django otherwise bare: no other middleware, no apps.',
    'Django django-ratelimit: the view under `@ratelimit(key="ip", rate="1000000/1s", block=True)` on the '
    "local-memory cache, its `RatelimitMiddleware` answering 429 through `RATELIMIT_VIEW`; a fixed window.",
)


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def render_markdown(result: WebBenchResult) -> str:
    """The report: settings and machine, one table per stack, the targets, what was skipped."""
    s = result.settings
    versions = ", ".join(f"{name} {version}" for name, version in result.versions.items())
    placement = (
        "server pinned to CPU 0 and wrk to CPU 1 with `taskset`"
        if result.pinned
        else "no pinning (the kernel places server and wrk)"
    )
    out = [
        "## Web middleware: ratekeeper, the bare app and the peers under wrk",
        "",
        f"{result.machine}; {result.wrk}; {versions}.",
        "",
        f"wrk `-t{s.threads} -c{s.connections} -d{s.duration}s` per round, {s.rounds} round(s) per case taken in "
        f"turn, the median round reported; {'1 s of wrk per case before the rounds; ' if s.warm_up else ''}"
        f"{placement}. Starlette under uvicorn (1 process, httptools, uvloop, no access log); Flask and Django "
        "under gunicorn (1 gthread worker, 1 thread, keep-alive, no access log). One endpoint, `GET /bench` "
        "answering `ok`; every request from 127.0.0.1 (one key). *allowed*: a limit of 1,000,000/s; "
        "*denied*: 1/hour, spent before timing. *× bare*: requests/s over the same stack's bare app. "
        "*server CPU*, *wrk CPU*: each one's CPU time over the round's wall time; *others*: the share of the "
        "server's CPU that other processes used meanwhile (pinned runs only). *per CPU-s*: requests per "
        "second of the server's CPU time (the median over the rounds), the inverse of its cost per request: "
        "steadier than requests/s when other processes take CPU time, but for the Redis cases, where the "
        "server also waits, a cost rather than a reachable rate.",
        "",
        report.format_machine_load(result.load_before, result.load_after),
        "",
    ]
    busy = [r for r in result.results if r.median.server_cpu < 0.9]
    if busy:
        lowest = min(r.median.server_cpu for r in busy)
        out += [
            f"> **The server did not have its CPU to itself**: in {len(busy)} of {len(result.results)} cases the "
            f"server's CPU share in the median round was under 90 % (lowest {lowest:.0%}): other processes "
            "competed for its CPU, or wrk could not keep it busy. Rates are low and ratios noisy there.",
            "",
        ]
    for stack in s.stacks:
        rows = [r for r in result.results if r.case.stack == stack]
        failed = [f for f in result.failures if f.case.stack == stack]
        if not rows and not failed:
            continue
        out += [
            f"### {stack.capitalize()} ({FRAMEWORKS[stack].server})",
            "",
            "| case | requests/s | × bare | per CPU-s | × bare | p50 ms | p99 ms | non-2xx | server CPU | wrk CPU "
            "| others | rounds, requests/s |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for r in rows:
            ratio, cpu_ratio = result.ratio_to_bare(r), result.cpu_ratio_to_bare(r)
            w = r.median.wrk
            errors = f", {w.socket_errors} socket errors" if w.socket_errors else ""
            rates = ", ".join(report.format_rate(x.wrk.rate) for x in r.rounds)
            others = "n/a" if r.median.others_cpu is None else f"{r.median.others_cpu:.0%}"
            out.append(
                f"| {r.case.label} | {report.format_rate(w.rate)} | {_ratio(ratio)} | "
                f"{report.format_rate(r.cpu_rate)} | {_ratio(cpu_ratio)} | {report.ms(w.p50_us)} | "
                f"{report.ms(w.p99_us)} | {report.format_fraction(w.non_2xx_fraction)}{errors} | "
                f"{r.median.server_cpu:.0%} | {r.median.wrk_cpu:.0%} | {others} | {rates} |"
            )
        out += [f"| {f.case.label} | failed | | | | | | | | | | {f.error} |" for f in failed]
        out.append("")
    out += [
        "### Targets",
        "",
        "| target | threshold | requests/s ratio | met | per CPU-s ratio | met |",
        "| --- | ---: | ---: | --- | ---: | --- |",
    ]
    for t in result.targets():
        out.append(
            f"| {t.what} | ≥ {t.threshold:.2f} | {_ratio(t.ratio)} | {report.verdict(t.met(t.ratio))} | "
            f"{_ratio(t.cpu_ratio)} | {report.verdict(t.met(t.cpu_ratio))} |"
        )
    out.append("")
    out += ["What each row runs:", ""]
    out += [f"- {what}" for what in _WHAT_RUNS if what.split(" ")[0].lower() in s.stacks]
    if "django" in s.stacks and not result.django_middleware:
        out.append("- Django ratekeeper, this run: `ratekeeper.web.django` is missing, so `WSGIRateLimitMiddleware` "
                   "wrapped Django's WSGI app instead.")  # fmt: skip
    out.append("")
    if result.skipped:
        out += ["Not measured:", ""]
        out += [f"- {case.stack} {case.label}: {reason}" for case, reason in result.skipped]
        out.append("")
    if result.redis_keys_deleted:
        out += [f"The run's {result.redis_keys_deleted} Redis key(s) were deleted at its end.", ""]
    return "\n".join(out) + "\n"


_VERSIONS = (
    "ratekeeper", "starlette", "uvicorn", "httptools", "uvloop", "flask", "django", "gunicorn",
    "slowapi", "limits", "flask-limiter", "django-ratelimit", "redis",
)  # fmt: skip
"""The packages whose versions the report names."""


# -- command line -------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``ratekeeper bench web`` to ``parser``."""
    add_load_options(
        parser,
        per_round="of wrk per case and round",
        durations=(DEFAULT_DURATION, QUICK_DURATION),
        rounds=(DEFAULT_ROUNDS, QUICK_ROUNDS),
        connections=DEFAULT_CONNECTIONS,
    )
    parser.add_argument("--threads", type=count(1), default=DEFAULT_THREADS, metavar="N", help="wrk -t (default 1)")
    parser.add_argument(
        "--stack",
        action="append",
        dest="stacks",
        choices=tuple(PEERS),
        metavar="NAME",
        help=f"measure only this stack (repeatable): {', '.join(PEERS)}",
    )
    parser.add_argument(
        "--redis-url", default=DEFAULT_URL, metavar="URL", help=f"Redis for ratekeeper's redis cases ({DEFAULT_URL})"
    )
    add_server_run_options(parser, pin_help="do not pin the server to CPU 0 and wrk to CPU 1")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The ``Settings`` of arguments parsed by a parser given ``add_arguments``."""
    quick: bool = args.quick
    return Settings(
        duration=options.or_default(args.duration, quick, DEFAULT_DURATION, QUICK_DURATION),
        rounds=options.or_default(args.rounds, quick, DEFAULT_ROUNDS, QUICK_ROUNDS),
        threads=args.threads,
        connections=args.connections,
        warm_up=not quick,
        pin=args.pin,
        stacks=choose(args.stacks, tuple(PEERS), "stack"),
        redis_url=args.redis_url,
    )


def bench_from_args(args: argparse.Namespace, out: TextIO, progress_stream: TextIO | None = None) -> WebBenchResult:
    """Run the benchmark as parsed by a parser given ``add_arguments``."""
    return run_web_bench(settings_from_args(args), out, args.progress, progress_stream)


def run(args: argparse.Namespace) -> int:
    """Run from parsed arguments: tables to standard output (and ``--markdown``); 1 if a case
    failed, 2 when wrk is missing."""
    try:
        result = bench_from_args(args, sys.stdout)
    except RuntimeError as exc:
        print(f"ratekeeper bench web: {exc}", file=sys.stderr)
        return 2
    return finish(result, args.markdown)


def main(argv: Sequence[str] | None = None) -> int:
    return options.command_main(argv, "ratekeeper bench web", __doc__.split("\n\n")[0], add_arguments, run)


if __name__ == "__main__":
    raise SystemExit(main())
