"""``ratekeeper bench serve``: the service (``ratekeeper serve``) under load, over HTTP and gRPC.

One run, one machine. The real service is started as a child process
(``python -m ratekeeper serve --store URL --rules FILE --rules FILE``: one process, uvicorn
with httptools and uvloop and ``grpc.aio`` on one event loop), once per store: memory and
Redis (``--redis-url``, a key prefix and rule names of the run's own; its keys are deleted
at the end). The rules files hold a rule of 1,000,000,000 per second (never refuses;
every call is decided and charged) and one of 1 per hour (spent before timing: every
call is refused), in the native form for ``/v1/check`` and the Envoy form for gRPC.

Peak cases, each loaded for ``--duration`` whole seconds per round:

- ``GET /healthz`` with wrk: the floor of the HTTP stack (no decision);
- ``POST /v1/check`` with wrk, one check per request, the key changing every request
  among 10,000; the same with a spent rule (every answer a 429);
- ``POST /v1/check`` with wrk, ``{"checks": [...]}`` of 100 checks on distinct keys:
  decisions/s = requests/s x 100;
- gRPC ``Health/Check`` with h2load: the floor of the gRPC stack (``grpc.aio`` and a
  servicer that decides nothing);
- gRPC ``ShouldRateLimit`` with h2load (C, 4 connections x 16 streams, one descriptor
  value, i.e. one key; the same with a spent descriptor) and with a grpcio asyncio
  client (64 calls in flight over 2 channels, 10,000 keys in turn).

``--rounds`` rounds go through every case of every store in turn, so a change in the
machine's load falls on all alike; each case reports its median round. Then two paced
runs per store (a Python asyncio client sending at a fixed rate, latency measured from
each call's due time, so a stall is not hidden): ``/v1/check`` at half its peak and
``ShouldRateLimit`` at half the gRPC peak, and ``GET /healthz`` at the ``/v1/check`` rate
(the floor: the latency of the stack and of the machine without a decision). With two CPUs or more the service is pinned
to CPU 0 and every load generator to CPU 1 (``taskset``; ``--no-pin`` leaves placement to
the kernel); each round reads the CPU time of both, and the time the service's threads
were runnable but waited for their CPU (``schedstat``): on a shared machine that wait,
not the service, is what bounds its rate, and the report says so.

Before a case is timed it is probed (200 and an allowed decision, 429 for a spent rule;
gRPC ``OK`` or ``OVER_LIMIT``; a batch of 100 decisions); a case that fails is reported,
not measured. The targets (memory store), each a ratio of two cases of the same server and
run, judged on requests/s and on requests per second of the service's CPU time, and each
printed met or not met: ``/v1/check`` >= 0.6x ``GET /healthz``; a decision inside a batch
of 100 costs at most 0.1x a 1-check request; gRPC ``ShouldRateLimit`` >= 0.9x gRPC
``Health/Check`` (both under h2load); and p99 < 5 ms at half the peak rate, over HTTP and
over gRPC.

The CLI calls ``add_arguments(parser)`` and ``run(args)``; progress goes to standard
error, the tables to standard output (and to ``--markdown PATH``).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
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
    describe,
    finish,
)
from ratekeeper_bench.serve_load import (
    GRPC_PATH,
    HEALTH_BODY,
    HEALTH_PATH,
    Load,
    LoadError,
    grpc_body,
    h2load_version,
    run_client,
    run_h2load,
    run_wrk,
    wrk_script,
)
from ratekeeper_bench.serve_service import OPEN_LIMIT, Names, Service, ServiceError, rules_files
from ratekeeper_bench.web_apps.servers import HOST
from ratekeeper_bench.web_apps.wrk import wrk_version

__all__ = [
    "KINDS",
    "STORES",
    "Case",
    "CaseResult",
    "Kind",
    "Paced",
    "ServeBenchResult",
    "Settings",
    "Target",
    "add_arguments",
    "run",
    "run_serve_bench",
    "settings_from_args",
]

DEFAULT_DURATION = 3
DEFAULT_ROUNDS = 3
QUICK_DURATION = 1
QUICK_ROUNDS = 1
DEFAULT_CONNECTIONS = 32
DEFAULT_URL = "redis://127.0.0.1:6379/0"
BATCH = 100
H2LOAD_CLIENTS = 4
H2LOAD_STREAMS = 16
GRPC_CONCURRENCY = 64
GRPC_CHANNELS = 2
WARM_UP_SECONDS = 1
STORES = ("memory", "redis")
PACED = {
    "http": "POST /v1/check ({connections} connections)",
    "healthz": "GET /healthz, the floor ({connections} connections)",
    "grpc": "gRPC ShouldRateLimit",
}
"""The paced runs, in order: the peak they halve is /v1/check's (``http``, ``healthz``) or gRPC's."""

HEALTHZ_SHARE = 0.60
"""``/v1/check`` requests/s over ``GET /healthz`` requests/s, at least."""
BATCH_DECISION_COST = 0.10
"""The cost of a decision inside a batch over that of a 1-check request, at most."""
GRPC_HEALTH_SHARE = 0.90
"""``ShouldRateLimit`` calls/s over gRPC ``Health/Check`` calls/s (h2load both), at least."""
HALF_PEAK_P99_MS = 5.0


@dataclass(frozen=True, slots=True)
class Kind:
    """A kind of peak case: what it sends, with which tool, how many decisions a request makes."""

    name: str
    label: str
    tool: str
    """``wrk``, ``h2load`` or ``client`` (``serve_client``, grpcio asyncio)."""
    decisions: int
    denied: bool = False


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("healthz", "GET /healthz", "wrk", 0),
        Kind("check", "POST /v1/check, 1 check, 10,000 keys", "wrk", 1),
        Kind("check_denied", "POST /v1/check, 1 check, spent rule (429)", "wrk", 1, denied=True),
        Kind("batch", f"POST /v1/check, {BATCH} checks, distinct keys", "wrk", BATCH),
        Kind("grpc_health", "gRPC Health/Check, h2load", "h2load", 0),
        Kind("grpc", "gRPC ShouldRateLimit, h2load, 1 key", "h2load", 1),
        Kind("grpc_denied", "gRPC ShouldRateLimit, h2load, spent descriptor", "h2load", 1, denied=True),
        Kind("grpc_keys", "gRPC ShouldRateLimit, grpcio asyncio client, 10,000 keys", "client", 1),
    )
}


@dataclass(frozen=True, slots=True)
class Case:
    kind: Kind
    store: str

    @property
    def label(self) -> str:
        return f"{self.store}: {self.kind.label}"


@dataclass(frozen=True, slots=True)
class Round:
    """One load run, and the shares of its wall time the service ran, the service waited
    for its CPU (runnable while another process held it), and the load generator ran."""

    load: Load
    server_cpu: float
    load_cpu: float
    server_wait: float = 0.0


@dataclass(frozen=True, slots=True)
class CaseResult:
    """A case's rounds; its figures are those of its median round (by requests/s)."""

    case: Case
    rounds: tuple[Round, ...]

    @property
    def median(self) -> Round:
        return report.median_by(self.rounds, lambda r: r.load.rate)

    @property
    def rate(self) -> float:
        return self.median.load.rate

    @property
    def decision_rate(self) -> float:
        return self.rate * self.case.kind.decisions

    @property
    def per_cpu_second(self) -> float | None:
        """Requests per second of the service's CPU time (median round): what it would
        answer with a CPU to itself, when other processes took part of its CPU."""
        median = self.median
        return median.load.rate / median.server_cpu if median.server_cpu > 0 else None


@dataclass(frozen=True, slots=True)
class Target:
    """A target: what it compares, its threshold, the figure measured on requests/s and
    the same on requests per second of the service's CPU time (``None``: not measured);
    ``at_most``: the figure must not pass the threshold (a cost), else it must reach it."""

    what: str
    threshold: float
    measured: float | None
    per_cpu: float | None = None
    at_most: bool = False
    unit: str = "x"

    def met(self, value: float | None) -> bool | None:
        if value is None:
            return None
        return value <= self.threshold if self.at_most else value >= self.threshold

    @property
    def bound(self) -> str:
        sign = ("≤" if self.unit == "x" else "<") if self.at_most else "≥"
        return f"{sign} {self.threshold:.2f}{'x' if self.unit == 'x' else ' ' + self.unit}"


@dataclass(frozen=True, slots=True)
class Paced:
    """A paced run: ``what`` (a key of ``PACED``) at half the ``peak`` of ``store``."""

    what: str
    store: str
    peak: float
    load: Load
    server_cpu: float
    load_cpu: float = 0.0
    server_wait: float = 0.0


@dataclass(frozen=True, slots=True)
class Settings:
    duration: int = DEFAULT_DURATION
    rounds: int = DEFAULT_ROUNDS
    connections: int = DEFAULT_CONNECTIONS
    warm_up: bool = True
    pin: bool = True
    stores: tuple[str, ...] = STORES
    redis_url: str = DEFAULT_URL
    prefix: str = ""
    """Redis key prefix of the run (made up when empty); nothing is left under it."""


@dataclass(slots=True)
class ServeBenchResult:
    settings: Settings
    pinned: bool
    machine: str
    run_id: str = ""
    tools: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    results: list[CaseResult] = field(default_factory=list)
    paced: list[Paced] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    service_logs: dict[str, str] = field(default_factory=dict)
    """store -> the last lines of its service's log, kept when some of its answers failed."""
    redis_keys_deleted: int = 0

    def result(self, kind: str, store: str) -> CaseResult | None:
        return next((r for r in self.results if r.case.kind.name == kind and r.case.store == store), None)

    def grpc_peak(self, store: str) -> float | None:
        """The best gRPC calls/s of ``store`` (h2load or the Python client), None if neither ran."""
        rates = [r.rate for k in ("grpc", "grpc_keys") if (r := self.result(k, store)) is not None]
        return max(rates) if rates else None

    def paced_run(self, what: str, store: str) -> Paced | None:
        return next((p for p in self.paced if p.what == what and p.store == store), None)

    def targets(self) -> list[Target]:
        """Issue 20's targets, on the memory store's results (``measured`` None when a case
        they compare did not run)."""
        check, healthz = self.result("check", "memory"), self.result("healthz", "memory")
        batch = self.result("batch", "memory")
        grpc, grpc_health = self.result("grpc", "memory"), self.result("grpc_health", "memory")
        out = [
            Target("/v1/check requests/s over GET /healthz requests/s", HEALTHZ_SHARE, *_ratios(check, healthz)),
            Target(
                f"a decision in a batch of {BATCH}: its cost over a 1-check request's",
                BATCH_DECISION_COST,
                *_ratios(check, batch, BATCH),
                at_most=True,
            ),
            Target(
                "gRPC ShouldRateLimit calls/s over gRPC Health/Check calls/s (h2load)",
                GRPC_HEALTH_SHARE,
                *_ratios(grpc, grpc_health),
            ),
        ]
        for kind, name in (("http", "/v1/check"), ("grpc", "gRPC ShouldRateLimit")):
            paced = self.paced_run(kind, "memory")
            p99 = None if paced is None else paced.load.p99_us / 1000
            out.append(Target(f"{name} p99 at half the peak rate", HALF_PEAK_P99_MS, p99, at_most=True, unit="ms"))
        return out

    def to_markdown(self) -> str:
        return render_markdown(self)


def _ratios(
    ours: CaseResult | None, floor: CaseResult | None, per_request: int = 1
) -> tuple[float | None, float | None]:
    """``ours`` over ``floor`` (``floor``'s rate times ``per_request``: its decisions), on
    requests/s and per second of the service's CPU time; None where either is missing."""
    if ours is None or floor is None or floor.rate <= 0:
        return None, None
    rate = ours.rate / (floor.rate * per_request)
    ours_cpu, floor_cpu = ours.per_cpu_second, floor.per_cpu_second
    per_cpu = None if not ours_cpu or not floor_cpu else ours_cpu / (floor_cpu * per_request)
    return rate, per_cpu


# -- probing -------------------------------------------------------------------------------


def _grpc_codes(service: Service, names: Names, key: str, value: str, calls: int) -> list[str]:
    import grpc  # type: ignore[import-untyped]
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]

    from ratekeeper_bench.serve_client import grpc_request

    with grpc.insecure_channel(service.grpc_target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        answers = [stub.ShouldRateLimit(grpc_request(names.domain, key, value), timeout=10) for _ in range(calls)]
    return [rls_pb2.RateLimitResponse.Code.Name(a.overall_code) for a in answers]


def _grpc_health(service: Service) -> str:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

    with grpc.insecure_channel(service.grpc_target) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))


def _probe(case: Case, service: Service, names: Names) -> None:
    """Check that ``case`` answers what it is meant to, or raise ``ServiceError``; a denied
    case's rule or descriptor is spent here."""
    kind = case.kind.name
    got: object
    if kind == "healthz":
        got = service.request("GET", "/healthz")[0]
        ok = got == 200
    elif kind == "check":
        status, doc = service.request("POST", "/v1/check", {"rule": names.open_rule, "key": "k0"})
        got, ok = (status, doc.get("allowed")), status == 200 and doc.get("allowed") is True
    elif kind == "check_denied":
        for _ in range(4):
            status, doc = service.request("POST", "/v1/check", {"rule": names.denied_rule, "key": "spent"})
        got, ok = (status, doc.get("allowed")), status == 429 and doc.get("allowed") is False
    elif kind == "batch":
        checks = [{"rule": names.open_rule, "key": f"k{i}"} for i in range(BATCH)]
        status, doc = service.request("POST", "/v1/check", {"checks": checks})
        got = (status, doc.get("allowed"), len(doc.get("decisions", ())))
        ok = got == (200, True, BATCH)
    elif kind == "grpc_health":
        # The service re-reads the store's health once a second: a slow store answer can
        # leave NOT_SERVING for a tick, so wait for SERVING a little before calling it wrong.
        deadline = time.monotonic() + 5.0
        while (got := _grpc_health(service)) != "SERVING" and time.monotonic() < deadline:
            time.sleep(0.1)
        ok = got == "SERVING"
    elif kind in ("grpc", "grpc_keys"):
        got = _grpc_codes(service, names, names.open_key, "k0", 2)
        ok = got == ["OK", "OK"]
    elif kind == "grpc_denied":
        got = _grpc_codes(service, names, names.denied_key, "spent", 4)[1:]
        ok = got == ["OVER_LIMIT"] * 3
    else:  # pragma: no cover - KINDS is closed
        raise AssertionError(kind)
    if not ok:
        raise ServiceError(f"the probe of {case.label} answered {got!r}")


# -- measuring -----------------------------------------------------------------------------


def _measure(case: Case, service: Service, names: Names, settings: Settings, seconds: int, cpu: int | None) -> Load:
    kind = case.kind.name
    url = f"http://{HOST}:{service.http_port}"
    if case.kind.tool == "wrk":
        script = wrk_script(
            {"check_denied": "denied"}.get(kind, kind),
            names.denied_rule if case.kind.denied else names.open_rule,
            BATCH,
        )
        path = "/healthz" if kind == "healthz" else "/v1/check"
        return run_wrk(url + path, script, seconds=seconds, connections=settings.connections, cpu=cpu)
    if case.kind.tool == "h2load":
        if kind == "grpc_health":
            path, body = HEALTH_PATH, HEALTH_BODY
        elif case.kind.denied:
            path, body = GRPC_PATH, grpc_body(names.domain, names.denied_key, "spent")
        else:
            path, body = GRPC_PATH, grpc_body(names.domain, names.open_key, "k0")
        return run_h2load(
            service.grpc_target,
            body,
            path=path,
            seconds=seconds,
            clients=H2LOAD_CLIENTS,
            streams=H2LOAD_STREAMS,
            warm_up=WARM_UP_SECONDS if settings.warm_up else 0,
            cpu=cpu,
        )
    arguments = [
        "grpc-peak", "--target", service.grpc_target, "--domain", names.domain, "--key", names.open_key,
        "--channels", str(GRPC_CHANNELS), "--concurrency", str(GRPC_CONCURRENCY), "--seconds", str(seconds),
    ]  # fmt: skip
    return run_client(arguments, seconds=seconds, cpu=cpu)


def _timed(service: Service, load: Callable[[], Load]) -> Round:
    """Run ``load`` and read the CPU time the service and the load generator used meanwhile."""
    cpu_before, wait_before = service.cpu_seconds(), service.runqueue_seconds()
    # The load generator is the only child that ends during the run: the children's usage is its own.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    measured = load()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    server = service.cpu_seconds() - cpu_before
    wait = service.runqueue_seconds() - wait_before
    loader = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    seconds = measured.seconds + measured.warm_up  # the CPU was read around the warm-up too
    seconds = seconds if seconds > 0 else 1.0
    return Round(measured, server / seconds, loader / seconds, wait / seconds)


def _summary(r: Round, kind: Kind) -> str:
    load = r.load
    text = f"{report.format_rate(load.rate)} req/s"
    if kind.decisions > 1:
        text += f" ({report.format_rate(load.rate * kind.decisions)} decisions/s)"
    text += (
        f", p50 {load.p50_us / 1000:.2f} ms, p99 {load.p99_us / 1000:.2f} ms, "
        f"server CPU {r.server_cpu:.0%} (waited {r.server_wait:.0%}), load CPU {r.load_cpu:.0%}"
    )
    if load.refused:
        text += f", refused {report.format_fraction(load.refused / max(1, load.requests))}"
    if load.failed:
        text += f", failed {report.format_fraction(load.failed / max(1, load.requests))}"
    if load.errors:
        text += f", {load.errors} errors"
    return text


def _paced(
    what: str, store: str, peak: float, service: Service, names: Names, settings: Settings, cpu: int | None
) -> Paced:
    rate = max(1.0, peak / 2)
    if what in ("http", "healthz"):
        arguments = ["http-paced", "--port", str(service.http_port), "--connections", str(settings.connections)]
        arguments += ["--rule", names.open_rule] if what == "http" else ["--path", "/healthz"]
    else:
        arguments = [
            "grpc-paced", "--target", service.grpc_target, "--domain", names.domain, "--key", names.open_key,
            "--channels", str(GRPC_CHANNELS),
        ]  # fmt: skip
    arguments += ["--rate", f"{rate:.1f}", "--seconds", str(settings.duration)]
    r = _timed(service, lambda: run_client(arguments, seconds=settings.duration, cpu=cpu))
    return Paced(what, store, peak, r.load, r.server_cpu, r.load_cpu, r.server_wait)


def _skip_reason(kind: Kind, store: str, redis_down: str | None, h2load: str | None) -> str | None:
    if store == "redis" and redis_down:
        return redis_down
    if kind.tool == "h2load" and h2load is None:
        return "h2load is not installed (Debian: apt-get install nghttp2-client)"
    return None


def run_serve_bench(
    settings: Settings, out: TextIO, progress: bool, progress_stream: TextIO | None = None
) -> ServeBenchResult:
    """Run every case on every chosen store; the Markdown report goes to ``out``.

    Raises ``RuntimeError`` when wrk is missing. A case that cannot run here (Redis down,
    h2load missing) is listed as skipped; one that fails (no start, wrong probe, a load
    generator's error) as a failure.
    """
    if settings.duration < 1 or settings.rounds < 1:
        raise ValueError("duration (whole seconds) and rounds must be at least 1")
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is not installed (Debian: apt-get install wrk)")
    h2load = h2load_version()
    pinned = settings.pin and (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
    server_cpu, load_cpu = (0, 1) if pinned else (None, None)
    run_id = secrets.token_hex(4)
    names = Names(run_id)
    prefix = settings.prefix or f"rk-bench-serve-{run_id}:"
    result = ServeBenchResult(
        settings=settings,
        pinned=pinned,
        machine=f"Python {platform.python_version()} on {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs",
        run_id=run_id,
        tools=[wrk_version(wrk), *([h2load] if h2load else [])],
        versions=versions(
            ("ratekeeper", "uvicorn", "httptools", "uvloop", "grpcio", "protobuf", "xds-protos", "redis")
        ),
        load_before=os.getloadavg(),
    )
    redis_down = redis_reachable(settings.redis_url) if "redis" in settings.stores else None
    cases: list[Case] = []
    for store in settings.stores:
        for kind in KINDS.values():
            reason = _skip_reason(kind, store, redis_down, h2load)
            if reason is None:
                cases.append(Case(kind, store))
            else:
                result.skipped.append((Case(kind, store).label, reason))
    live_stores = [s for s in settings.stores if any(c.store == s for c in cases)]
    bar = report.Progress(
        progress_stream if progress_stream is not None else sys.stderr,
        len(cases) * settings.rounds + len(PACED) * len(live_stores),
        enabled=progress,
    )
    for label, reason in result.skipped:
        bar.note(f"skipping {label}: {reason}")
    try:
        with tempfile.TemporaryDirectory(prefix="rk-bench-serve-") as tmp, ExitStack() as stop:
            rules = rules_files(names, Path(tmp))
            services: dict[str, Service] = {}
            for store in live_stores:
                service = Service(
                    store_url(store, settings.redis_url, prefix),
                    rules,
                    Path(tmp) / f"serve-{store}.log",
                    cpu=server_cpu,
                )
                service.start()
                stop.callback(service.stop)
                services[store] = service
            rounds: dict[Case, list[Round]] = {}
            for case in cases:
                service = services[case.store]
                try:
                    service.wait_ready()
                    _probe(case, service, names)
                    if settings.warm_up and case.kind.tool != "h2load":  # h2load warms up itself
                        _measure(case, service, names, settings, WARM_UP_SECONDS, load_cpu)
                except (ServiceError, LoadError, OSError, RuntimeError) as exc:
                    result.failures.append((case.label, describe(exc)))
                    bar.note(f"{case.label}: failed: {describe(exc)}")
                    for _ in range(settings.rounds):
                        bar.finish(case.label, "failed")
                    continue
                rounds[case] = []
            for n in range(1, settings.rounds + 1):
                for case in list(rounds):
                    label = f"{case.label}, round {n}/{settings.rounds}"
                    bar.start(label)
                    service = services[case.store]
                    try:
                        measured = _timed(
                            service,
                            lambda: _measure(case, service, names, settings, settings.duration, load_cpu),  # noqa: B023
                        )
                    except (LoadError, OSError) as exc:
                        result.failures.append((case.label, describe(exc)))
                        bar.note(f"{label}: failed: {describe(exc)}")
                        for _ in range(n, settings.rounds + 1):
                            bar.finish(label, "failed")
                        del rounds[case]
                        continue
                    rounds[case].append(measured)
                    bar.finish(label, _summary(measured, case.kind))
            result.results = [CaseResult(case, tuple(rs)) for case, rs in rounds.items()]
            for store, service in services.items():
                if any(r.load.failed for case, rs in rounds.items() if case.store == store for r in rs):
                    result.service_logs[store] = service.log_tail(5)
            for store in live_stores:
                check = result.result("check", store)
                for what in PACED:
                    label = f"{store}: {what} paced at half its peak"
                    peak = result.grpc_peak(store) if what == "grpc" else (check.rate if check else None)
                    if not peak:
                        bar.finish(label, "not run (no peak measured)")
                        continue
                    bar.start(label)
                    try:
                        paced = _paced(what, store, peak, services[store], names, settings, load_cpu)
                    except (LoadError, OSError) as exc:
                        result.failures.append((label, describe(exc)))
                        bar.finish(label, f"failed: {describe(exc)}")
                        continue
                    result.paced.append(paced)
                    bar.finish(
                        label,
                        f"{report.format_rate(paced.load.rate)} of {report.format_rate(paced.load.rate_asked)} "
                        f"req/s, p50 {paced.load.p50_us / 1000:.2f} ms, p99 {paced.load.p99_us / 1000:.2f} ms",
                    )
    finally:
        bar.close()
        if "redis" in settings.stores and redis_down is None:
            from ratekeeper_bench.redis import cleanup

            result.redis_keys_deleted = cleanup(settings.redis_url, prefix)
        result.load_after = os.getloadavg()
    out.write(result.to_markdown())
    out.flush()
    return result


# -- report --------------------------------------------------------------------------------


def _figure(target: Target, value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}x" if target.unit == "x" else f"{value:.2f} {target.unit}"


def render_markdown(result: ServeBenchResult) -> str:
    """The report: machine and settings, the peak table, the paced table, the targets."""
    s = result.settings
    versions = ", ".join(f"{name} {version}" for name, version in result.versions.items())
    placement = (
        "the service pinned to CPU 0 and every load generator to CPU 1 with `taskset`"
        if result.pinned
        else "no pinning (the kernel places the service and the load generators)"
    )
    out = [
        "## The service (`ratekeeper bench serve`)",
        "",
        f"{result.machine}; {'; '.join(result.tools)}; {versions}.",
        "",
        f"`ratekeeper serve` (one process: uvicorn with httptools and uvloop, `grpc.aio`, one event loop) on "
        f"each store, {placement}. {s.duration} s per round, {s.rounds} round(s) per case taken in turn, the "
        f"median round reported{'; 1 s of load per case before the rounds' if s.warm_up else ''}. wrk: 1 thread, "
        f"{s.connections} connections. h2load: {H2LOAD_CLIENTS} connections x {H2LOAD_STREAMS} streams. grpcio "
        f"client: {GRPC_CONCURRENCY} calls in flight over {GRPC_CHANNELS} channels. Rules: {OPEN_LIMIT:,}/s (never "
        "refuses; each call decided and charged) and 1/hour spent before timing (*spent*: every answer refused). "
        "*decisions/s* = requests/s x checks per request; *refused*: share of 429 / `OVER_LIMIT` answers "
        "(h2load does not read gRPC trailers: its spent case is probed, not counted); *failed*: other non-2xx "
        "answers (a 503 is a store failure) and socket errors; *server CPU*, *load CPU*: CPU time of the service "
        "and of the load generator over the round's wall time; *server waited*: time the service's event-loop "
        "thread was runnable but another process held CPU 0 (`/proc/PID/schedstat`), over the wall time; *per "
        "server CPU-s*: requests per second of the service's CPU time.",
        "",
        report.format_machine_load(result.load_before, result.load_after),
        "",
    ]
    busy = [r for r in result.results if r.median.server_cpu < 0.9]
    if busy:
        lowest = min(r.median.server_cpu for r in busy)
        out += [
            f"> **The service did not have its CPU to itself**: in {len(busy)} of {len(result.results)} cases its "
            f"CPU share in the median round was under 90 % (lowest {lowest:.0%}): other processes took CPU 0 "
            "(*server waited*), or the load generator could not keep the service busy. Rates are low and ratios "
            "noisy there; *per server CPU-s* is the better guide.",
            "",
        ]
    out += [
        "### Peak",
        "",
        "| store | case | requests/s | decisions/s | p50 ms | p99 ms | refused | failed | server CPU "
        "| server waited | per server CPU-s | load CPU | rounds, requests/s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in result.results:
        load = r.median.load
        failed = report.format_fraction(load.failed / max(1, load.requests))
        if load.failed:
            failed += " (" + ", ".join(str(code) for code, _ in load.statuses if code >= 300 and code != 429) + ")"
        failed += f", {load.errors} errors" if load.errors else ""
        decisions = report.format_rate(r.decision_rate) if r.case.kind.decisions else "-"
        refused = report.format_fraction(load.refused / max(1, load.requests))
        if r.case.kind.tool == "h2load":
            refused = "probed" if r.case.kind.denied else "n/a"
        out.append(
            f"| {r.case.store} | {r.case.kind.label} | {report.format_rate(load.rate)} | {decisions} | "
            f"{report.ms(load.p50_us)} | {report.ms(load.p99_us)} | {refused} | {failed} | {r.median.server_cpu:.0%} | "
            f"{r.median.server_wait:.0%} | "
            f"{'n/a' if r.per_cpu_second is None else report.format_rate(r.per_cpu_second)} | "
            f"{r.median.load_cpu:.0%} | {', '.join(report.format_rate(x.load.rate) for x in r.rounds)} |"
        )
    out += [f"| | {label} | failed | | | | | | | | | | {error} |" for label, error in result.failures]
    out += [
        "",
        "### Latency at half the peak rate",
        "",
        "A Python asyncio client (uvloop) sends at a fixed rate, half the store's peak (`/v1/check`: the "
        "1-check case; gRPC: the best gRPC case), for the round's duration; a call's latency runs from the "
        "moment it was due, so a stall of the service or of the client counts. `GET /healthz` at the rate of "
        "the `/v1/check` run is the floor: the latency of the HTTP stack and of the machine without a decision.",
        "",
        "| store | calls | peak/s | asked/s | achieved/s | p50 ms | p99 ms | max ms | errors | server CPU "
        "| server waited | load CPU |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in result.paced:
        what = PACED[p.what].format(connections=s.connections)
        out.append(
            f"| {p.store} | {what} | {report.format_rate(p.peak)} | {report.format_rate(p.load.rate_asked)} | "
            f"{report.format_rate(p.load.rate)} | {report.ms(p.load.p50_us)} | {report.ms(p.load.p99_us)} | "
            f"{report.ms(p.load.max_us)} | {p.load.errors + p.load.failed} | {p.server_cpu:.0%} | "
            f"{p.server_wait:.0%} | {p.load_cpu:.0%} |"
        )
    out += [
        "",
        "### Targets (memory store)",
        "",
        "Each ratio compares two cases of the same server in this run. *per server CPU-s*: the same ratio "
        "of requests per second of the service's CPU time, i.e. of what each case would reach with CPU 0 to "
        "itself (steadier than requests/s when other processes took part of CPU 0).",
        "",
        "| target | threshold | measured | met | per server CPU-s | met |",
        "| --- | ---: | ---: | --- | ---: | --- |",
    ]
    for t in result.targets():
        per_cpu = "- | -" if t.unit != "x" else f"{_figure(t, t.per_cpu)} | {report.verdict(t.met(t.per_cpu))}"
        out.append(
            f"| {t.what} | {t.bound} | {_figure(t, t.measured)} | {report.verdict(t.met(t.measured))} | {per_cpu} |"
        )
    out.append("")
    if result.skipped:
        out += ["Not measured:", ""]
        out += [f"- {label}: {reason}" for label, reason in result.skipped]
        out.append("")
    for store, tail in result.service_logs.items():
        out += [f"Some answers of the {store} service failed; the end of its log: `{tail}`", ""]
    if result.redis_keys_deleted:
        out += [f"The run's {result.redis_keys_deleted} Redis key(s) were deleted at its end.", ""]
    return "\n".join(out) + "\n"


# -- command line --------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``ratekeeper bench serve`` to ``parser``."""
    add_load_options(
        parser,
        per_round="per case and round",
        durations=(DEFAULT_DURATION, QUICK_DURATION),
        rounds=(DEFAULT_ROUNDS, QUICK_ROUNDS),
        connections=DEFAULT_CONNECTIONS,
    )
    parser.add_argument(
        "--store",
        action="append",
        dest="stores",
        choices=STORES,
        metavar="NAME",
        help=f"measure only this store (repeatable): {', '.join(STORES)}",
    )
    parser.add_argument(
        "--redis-url", default=DEFAULT_URL, metavar="URL", help=f"Redis for the redis store ({DEFAULT_URL})"
    )
    add_server_run_options(parser, pin_help="do not pin the service to CPU 0 and the load to CPU 1")
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="instead of the cases: decisions per CPU-second on Redis of one process, of ratekeeper serve "
        "--workers N and of N serve processes (serve_workers.py)",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    quick: bool = args.quick
    return Settings(
        duration=options.or_default(args.duration, quick, DEFAULT_DURATION, QUICK_DURATION),
        rounds=options.or_default(args.rounds, quick, DEFAULT_ROUNDS, QUICK_ROUNDS),
        connections=args.connections,
        warm_up=not quick,
        pin=args.pin,
        stores=choose(args.stores, STORES, "store"),
        redis_url=args.redis_url,
    )


def run(args: argparse.Namespace) -> int:
    """Run from parsed arguments: tables to standard output (and ``--markdown``); 1 if a case
    failed, 2 when wrk is missing."""
    if args.workers is not None:
        return _run_workers(args)
    try:
        result = run_serve_bench(settings_from_args(args), sys.stdout, args.progress)
    except RuntimeError as exc:
        print(f"ratekeeper bench serve: {exc}", file=sys.stderr)
        return 2
    return finish(result, args.markdown)


def _run_workers(args: argparse.Namespace) -> int:
    """``--workers N``: the table to standard output (and ``--markdown``); 2 when a setup
    could not be measured."""
    from ratekeeper_bench.serve_workers import render, run_workers_bench

    if args.workers < 2:
        print("ratekeeper bench serve: --workers compares N >= 2 workers with one process", file=sys.stderr)
        return 2
    settings = settings_from_args(args)
    try:
        results = run_workers_bench(
            args.workers,
            settings.redis_url,
            seconds=settings.duration,
            rounds=settings.rounds,
            connections=settings.connections,
        )
    except RuntimeError as exc:
        print(f"ratekeeper bench serve: {exc}", file=sys.stderr)
        return 2
    if args.markdown is not None:
        args.markdown.write_text(render(results, args.workers) + "\n", encoding="utf-8")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return options.command_main(argv, "ratekeeper bench serve", __doc__.split("\n\n")[0], add_arguments, run)


if __name__ == "__main__":
    raise SystemExit(main())
