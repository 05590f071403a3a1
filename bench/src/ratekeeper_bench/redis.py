"""``ratekeeper bench redis``: ratekeeper's Redis store against its peers on the same Redis.

One run, one Redis (``--url``, default ``redis://127.0.0.1:6379/0``), every key under a
prefix of its own that the run deletes at the end (``SCAN`` + ``UNLINK`` of that
prefix; never ``FLUSHDB``, never ``KEYS``). Four parts:

1. **Throughput and latency.** Each (library, algorithm) makes decisions for
   ``--duration`` seconds in two scenarios (one hot key; ``--keys`` keys round robin,
   100,000 by default), under a limit of 1,000,000,000 per second so that nearly every
   call is allowed and every library does its full write, in two modes: ``sync`` (one
   thread, calls back to back) and ``async`` (``--tasks`` asyncio tasks, 50 by default,
   sharing one limiter). Next to them the raw floor: one redis-py round trip per call
   (``EVALSHA`` of a script that returns 1, and ``INCR``) on one connection, and with
   redis.asyncio from the same number of tasks. Reported: decisions/s, p50 and p99
   latency, the rate over the raw ``EVALSHA`` floor, and ratekeeper over the best peer
   (a peer: over ratekeeper's best comparable algorithm).
2. **Coalescing.** One hot key, 100 concurrent async callers, ratekeeper's GCRA with
   coalescing and auto-pipelining (the default) and without (``UNBATCHED``).
3. **The hammer.** For every library and algorithm: 8 processes x 4 threads call for one
   key under a limit of 100 per hour, 25 attempts each (800 in all); admitted must be
   exactly 100.
4. **Redis CPU per decision and the sliding log by length.** On a private
   ``redis-server`` the run starts (on ``--url`` when none is installed or with
   ``--cost-on-url``), sync: every ratekeeper algorithm with one limit (one hot key),
   the sliding log with two limits, and the sliding log held at 10, 600 and 10,000 live
   entries (``LOG_LENGTHS``: a limit of L per L ms and one call per ms of the call's own
   time, so each call expires one entry and appends one), next to the floors: ``EVALSHA``
   of ``return 1`` and ``FCALL`` of a function returning 1. Reported: decisions/s and the
   server's µs per call of the command each decision ran (``FCALL`` of the store's
   library, or ``EVALSHA`` on a server without Functions; ``INFO commandstats``, the
   change over the cell), each over the floor of the same command.
5. **Where an asyncio decision's time goes** (``asyncio_split``), on the same server as
   part 4: for every ratekeeper algorithm, ``--tasks`` tasks on one ``AsyncLimiter``, one
   hot key and ``--keys`` keys: decisions/s, the client's CPU and Redis's CPU per
   decision, decisions per script call; and the client-only floors (asyncio alone; the
   coalescer with the wire format and no server).
6. The Markdown tables (standard output and ``--markdown PATH``); progress on standard
   error.

Defaults take about three to four minutes (17 subjects x 2 scenarios x 2 modes x 2 s,
plus warm-ups, coalescing and the hammer). The CLI calls ``add_arguments(parser)`` and
``run(args)``; ``main(argv)`` runs it alone (``python -m ratekeeper_bench.redis``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import multiprocessing
import os
import platform
import secrets
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from ratekeeper_bench import options, report
from ratekeeper_bench.asyncio_split import FloorCell, SplitCell, measure_floors, measure_split, render_split
from ratekeeper_bench.latency import Sample, Target, time_sync, time_tasks
from ratekeeper_bench.options import add_common_options, choose, count, describe, finish
from ratekeeper_bench.peers import LimitSpec, library_version
from ratekeeper_bench.redis_peers import (
    LIBRARIES,
    RATEKEEPER_ALGORITHMS,
    UNBATCHED,
    RedisSubject,
    floor_subjects,
    ratekeeper_subject,
    subject,
    subjects,
)

__all__ = [
    "DEFAULT_DURATION",
    "DEFAULT_KEYS",
    "DEFAULT_URL",
    "HAMMER_SPEC",
    "LOG_LENGTHS",
    "MODES",
    "SCENARIOS",
    "Cell",
    "CostCell",
    "HammerCell",
    "RedisBenchResult",
    "Settings",
    "add_arguments",
    "bench_from_args",
    "cleanup",
    "main",
    "run",
    "run_redis_bench",
]

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_DURATION = 2.0
DEFAULT_KEYS = 100_000
DEFAULT_TASKS = 50
COALESCING_CALLERS = 100
QUICK_DURATION = 0.1
QUICK_KEYS = 1_000

SPEC = LimitSpec(1_000_000_000, 1)
"""The throughput cells' limit: nearly every call allowed, so every library writes its state."""

HAMMER_SPEC = LimitSpec(100, 3600)
HAMMER_PROCESSES = 8
HAMMER_THREADS = 4
HAMMER_ATTEMPTS = 25
"""Attempts per thread: 8 x 4 x 25 = 800 calls for a limit of 100."""

LOG_LENGTHS = (10, 600, 10_000)
LOG_STEP_US = 1000
"""The sliding log cells: a limit of L per L x LOG_STEP_US µs, one call per LOG_STEP_US µs."""

FLOOR_FUNCTION = "ratekeeper_bench_floor"
FLOOR_LIBRARY = f"#!lua name={FLOOR_FUNCTION}\nredis.register_function('{FLOOR_FUNCTION}', function() return 1 end)"
"""The ``FCALL`` floor: a library whose one function returns 1."""


BURST = 3000
BURST_SAMPLES = 7
"""Back to back: ``BURST`` calls pipelined 100 at a time per sample, the least of ``BURST_SAMPLES``."""

SCENARIOS = ("hot_key", "many_keys")
MODES = ("sync", "async")
WARM_CALLS = 20


@dataclass(frozen=True, slots=True)
class Cell:
    """One (library, algorithm) in one scenario and mode; ``library`` is ``redis-py`` for the floor."""

    library: str
    algorithm: str
    scenario: str
    mode: str
    comparable: tuple[str, ...]
    sample: Sample
    round_rates: tuple[float, ...] = ()
    """The rate of every round (``--rounds``); ``sample`` is the round with the median rate."""

    @property
    def rate(self) -> float:
        return self.sample.rate


@dataclass(frozen=True, slots=True)
class HammerCell:
    """Admissions under the 8-process hammer: ``admitted`` must equal ``expected``."""

    library: str
    algorithm: str
    expected: int
    admitted: int
    attempts: int
    errors: int
    seconds: float
    first_error: str = ""


@dataclass(frozen=True, slots=True)
class CostCell:
    """One subject of the server-cost part: sync rate and the server's µs per call."""

    subject: str
    rate: float
    usec_per_call: float
    calls: int
    errors: int = 0
    denied: int = 0
    command: str = "EVALSHA"
    """The command whose server time was measured (``FCALL`` or ``EVALSHA``)."""
    back_to_back: float = 0.0
    """µs per call when Redis runs the same calls back to back (``BURST`` pipelined, the
    least of ``BURST_SAMPLES``); 0 where not measured (the log-length cells)."""


@dataclass(slots=True)
class RedisBenchResult:
    """Everything one run measured, and the ratios derived from it."""

    url: str
    duration: float
    keys: int
    tasks: int
    rounds: int
    scenarios: tuple[str, ...]
    libraries: tuple[str, ...]
    python: str
    versions: dict[str, str] = field(default_factory=dict)
    calls: dict[tuple[str, str], str] = field(default_factory=dict)
    cells: list[Cell] = field(default_factory=list)
    coalescing: list[Cell] = field(default_factory=list)
    hammer: list[HammerCell] = field(default_factory=list)
    costs: list[CostCell] = field(default_factory=list)
    cost_server: str = ""
    """Where the server-cost part ran (a private redis-server, or ``url``)."""
    split: list[SplitCell] = field(default_factory=list)
    split_floors: list[FloorCell] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    failures: list[tuple[str, str]] = field(default_factory=list)
    """(step, error) of every step that raised."""
    load: str = ""
    prefix: str = ""
    """The run's key prefix; nothing is left under it when the run ends."""

    def rows(self, scenario: str, mode: str) -> list[Cell]:
        return [c for c in self.cells if (c.scenario, c.mode) == (scenario, mode)]

    def floor(self, scenario: str, mode: str) -> Cell | None:
        """The raw ``EVALSHA`` floor of a scenario and mode."""
        return next((c for c in self.rows(scenario, mode) if (c.library, c.algorithm) == ("redis-py", "EVALSHA")), None)

    def best_peer(self, scenario: str, mode: str) -> Cell | None:
        peers = [c for c in self.rows(scenario, mode) if c.library not in ("ratekeeper", "redis-py")]
        return max(peers, key=lambda c: c.rate, default=None)

    def best_ratekeeper(self, scenario: str, mode: str, comparable: Sequence[str]) -> Cell | None:
        ours = [c for c in self.rows(scenario, mode) if c.library == "ratekeeper" and c.algorithm in comparable]
        return max(ours, key=lambda c: c.rate, default=None)

    def to_markdown(self) -> str:
        return render_markdown(self)


# -- measuring ----------------------------------------------------------------------------------


def _keys(scenario: str, n_keys: int) -> list[str]:
    return ["hot"] if scenario == "hot_key" else [f"k{i}" for i in range(n_keys)]


def _measure(subj: RedisSubject, target: Target, scenario: str, mode: str, keys: list[str], args: Settings) -> Cell:
    sample: Sample
    if mode == "sync":
        runner = subj.build(target, SPEC)
        try:
            for key in itertools.islice(itertools.cycle(keys), WARM_CALLS):
                runner.decide(key)
            gc.collect()
            sample = time_sync(runner.decide, itertools.cycle(keys), args.duration)
        finally:
            runner.close()
    else:
        sample = asyncio.run(_measure_async(subj, target, keys, args.duration, args.tasks))
    return Cell(subj.library, subj.algorithm, scenario, mode, subj.comparable, sample)


async def _measure_async(subj: RedisSubject, target: Target, keys: list[str], duration: float, tasks: int) -> Sample:
    runner = await subj.abuild(target, SPEC)
    try:
        warm = itertools.cycle(keys)
        await asyncio.gather(*(runner.decide(next(warm)) for _ in range(WARM_CALLS)))
        gc.collect()
        return await time_tasks(runner.decide, itertools.cycle(keys), duration, tasks)
    finally:
        await runner.aclose()


def _hammer_worker(library: str, algorithm: str, target: Target, key: str, start_at: float) -> tuple[int, int, str]:
    """One hammer process: 4 threads x 25 attempts for ``key``; (admitted, errors, first error)."""
    runner = subject(library, algorithm).build(target, HAMMER_SPEC)
    try:
        runner.decide(f"{key}-warm-{os.getpid()}")  # connections and scripts ready before the start
        admitted = [0] * HAMMER_THREADS
        errors = [0] * HAMMER_THREADS
        first: list[str] = []
        barrier = threading.Barrier(HAMMER_THREADS)

        def thread(i: int) -> None:
            barrier.wait()
            for _ in range(HAMMER_ATTEMPTS):
                try:
                    admitted[i] += bool(runner.decide(key))
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    errors[i] += 1
                    if not first:
                        first.append(describe(exc))

        time.sleep(max(0.0, start_at - time.time()))
        threads = [threading.Thread(target=thread, args=(i,)) for i in range(HAMMER_THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(admitted), sum(errors), first[0] if first else ""
    finally:
        runner.close()


def _warm_worker(libraries: tuple[str, ...]) -> int:
    """Import what the hammer needs, once per process, before the first hammer starts."""
    for library in libraries:
        with contextlib.suppress(ImportError):
            subjects(library)
    time.sleep(0.2)  # hold this process so the next warm-up task starts another one
    return os.getpid()


def _hammer_pool(libraries: tuple[str, ...]) -> ProcessPoolExecutor:
    """``HAMMER_PROCESSES`` spawned processes, started and warm."""
    pool = ProcessPoolExecutor(HAMMER_PROCESSES, mp_context=multiprocessing.get_context("spawn"))
    list(pool.map(_warm_worker, [libraries] * HAMMER_PROCESSES))
    return pool


def _hammer(pool: ProcessPoolExecutor, subj: RedisSubject, target: Target) -> HammerCell:
    key = "hammer"
    start = time.perf_counter()
    start_at = time.time() + 1.0
    futures = [
        pool.submit(_hammer_worker, subj.library, subj.algorithm, target, key, start_at)
        for _ in range(HAMMER_PROCESSES)
    ]
    results = [f.result(timeout=120) for f in futures]
    return HammerCell(
        subj.library,
        subj.algorithm,
        expected=HAMMER_SPEC.count,
        admitted=sum(r[0] for r in results),
        attempts=HAMMER_PROCESSES * HAMMER_THREADS * HAMMER_ATTEMPTS,
        errors=sum(r[1] for r in results),
        seconds=time.perf_counter() - start,
        first_error=next((r[2] for r in results if r[2]), ""),
    )


def cleanup(url: str, prefix: str) -> int:
    """Delete every key under ``prefix`` (``SCAN`` + ``UNLINK``); return how many."""
    import redis

    deleted = 0
    # The store URL's own options (timeout=, prefix=) are ratekeeper's, not redis-py's.
    client: Any = redis.Redis.from_url(url.split("?", 1)[0])
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=prefix.replace("*", r"\*") + "*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                deleted += client.unlink(*batch)
                batch = []
        if batch:
            deleted += client.unlink(*batch)
    finally:
        client.close()
    return deleted


SCRIPT_COMMANDS = ("fcall", "evalsha")
"""The commands a decision may be (``FCALL`` of the library, ``EVALSHA`` where the server
has no Functions): the cost part counts whichever ran."""


def _script_stats(client: Any) -> dict[str, tuple[int, int]]:
    """(calls, µs) so far of each of ``SCRIPT_COMMANDS``, from ``INFO commandstats``."""
    stats = client.info("commandstats")
    out = {}
    for command in SCRIPT_COMMANDS:
        found = stats.get(f"cmdstat_{command}", {})
        out[command] = (int(found.get("calls", 0)), int(found.get("usec", 0)))
    return out


def _cost_cell(client: Any, subject: str, decide: Any, duration: float, burst: Any = None) -> CostCell:
    """``decide()`` back to back for ``duration`` s after a warm-up; the server's µs per
    call of the command it sent (``FCALL`` or ``EVALSHA``: the change of ``INFO
    commandstats`` over the cell). With ``burst`` (which sends that many of the same calls
    pipelined), also the µs per call when Redis runs them back to back."""
    for _ in range(WARM_CALLS):
        decide("warm")
    before = _script_stats(client)
    sample = time_sync(decide, itertools.repeat("k"), duration)
    after = _script_stats(client)
    # the command that ran: the one with the most calls over the cell
    command = max(SCRIPT_COMMANDS, key=lambda c: after[c][0] - before[c][0])
    calls = after[command][0] - before[command][0]
    usec = after[command][1] - before[command][1]
    back_to_back = 0.0
    if burst is not None:
        samples = []
        for _ in range(BURST_SAMPLES):
            start = _script_stats(client)[command]
            burst(BURST)
            end = _script_stats(client)[command]
            if end[0] > start[0]:
                samples.append((end[1] - start[1]) / (end[0] - start[0]))
        back_to_back = min(samples, default=0.0)
    return CostCell(
        subject,
        sample.rate,
        usec / calls if calls > 0 else 0.0,
        calls,
        sample.errors,
        sample.calls - sample.allowed - sample.errors,
        command.upper(),
        back_to_back,
    )


def _pipelined(client: Any, *command: Any) -> Any:
    """A ``burst(count)`` sending ``command`` ``count`` times, pipelined 100 at a time."""

    def burst(count: int) -> None:
        for start in range(0, count, 100):
            pipe = client.pipeline(transaction=False)
            for _ in range(min(100, count - start)):
                pipe.execute_command(*command)
            pipe.execute()

    return burst


def _cost_subjects(url: str, prefix: str) -> list[tuple[str, Any, Any, Any]]:
    """(label, decide, close, burst) of every server-cost cell, the floors first; ``burst``
    sends a cell's own call back to back (None for the log-length cells, whose calls each
    carry their own time)."""
    import redis

    from ratekeeper import Limit, Limiter, Rule
    from ratekeeper.op import Op

    client: Any = redis.Redis.from_url(url, single_connection_client=True)
    sha = client.script_load("return 1")
    out: list[tuple[str, Any, Any, Any]] = [
        (
            "redis-py `EVALSHA` of `return 1`",
            lambda key: client.evalsha(sha, 1, prefix + key) == 1,
            client.close,
            _pipelined(client, "EVALSHA", sha, 1, prefix + "k"),
        )
    ]
    fclient: Any = redis.Redis.from_url(url, single_connection_client=True)
    try:
        fclient.function_load(FLOOR_LIBRARY, replace=True)
    except redis.ResponseError:  # a server without Functions: the EVALSHA floor only
        fclient.close()
    else:
        out.append(
            (
                "redis-py `FCALL` of `return 1`",
                lambda key: fclient.fcall(FLOOR_FUNCTION, 1, prefix + key) == 1,
                fclient.close,
                _pipelined(fclient, "FCALL", FLOOR_FUNCTION, 1, prefix + "k"),
            )
        )

    def limiter_cell(label: str, rule: Rule) -> tuple[str, Any, Any, Any]:
        limiter = Limiter(url, prefix=f"{prefix}{len(out)}:")
        acquire = limiter.try_acquire
        store: Any = limiter.store

        def burst(count: int) -> None:
            # the store's own call for try_acquire(rule, "k"), as it sends it (FCALL, or
            # EVALSHA of the rule's script where the server has no Functions)
            planner = store.planner
            (call,) = planner.plan([Op.decide(rule.plan, "k", 1)], None)
            _pipelined(store.shell.client, *planner.command(call))(count)

        return label, lambda key: acquire(rule, key).allowed, limiter.close, burst

    for algorithm in (*RATEKEEPER_ALGORITHMS, "leaky_bucket"):
        out.append(limiter_cell(f"{algorithm}, one limit", Rule("cost", [str(SPEC)], algorithm=algorithm)))
    two = Rule("cost2", [str(SPEC), "2000000000/2s"], algorithm="sliding_window_log")
    out.append(limiter_cell("sliding_window_log, two limits", two))
    for length in LOG_LENGTHS:
        limiter = Limiter(url, prefix=f"{prefix}len{length}:")
        plan = Rule("len", [Limit(length, length * LOG_STEP_US / 1e6)], algorithm="sliding_window_log").plan
        op = Op.decide(plan, "k", 1)
        clock = itertools.count(1_750_000_000_000_000, LOG_STEP_US)
        decide_at = limiter.store.decide
        for _ in range(length):  # the log full before the cell starts
            decide_at(op, next(clock))

        def at_length(key: str, decide_at: Any = decide_at, op: Any = op, clock: Any = clock) -> bool:
            return bool(decide_at(op, next(clock)).allowed)

        out.append((f"sliding_window_log, {length:,} entries", at_length, limiter.close, None))
    return out


@contextlib.contextmanager
def _private_redis() -> Iterator[str | None]:
    """The URL of a ``redis-server`` started for this run (no persistence), or None when
    none is installed; stopped at the end."""
    import shutil
    import socket
    import subprocess
    import tempfile

    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="rkbench-redis-") as directory:
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                directory,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            import redis

            url = f"redis://127.0.0.1:{port}/0"
            deadline = time.monotonic() + 10
            while True:
                try:
                    with redis.Redis.from_url(url) as probe:
                        probe.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.02)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def measure_costs(
    url: str, prefix: str, duration: float, bar: report.Progress, failures: list[tuple[str, str]]
) -> list[CostCell]:
    """The server-cost cells on the Redis at ``url`` (see the module docstring, part 4)."""
    import redis

    cells: list[CostCell] = []
    client: Any = redis.Redis.from_url(url)
    try:
        for label, decide, close, burst in _cost_subjects(url, prefix):
            try:
                cell = _cost_cell(client, label, decide, duration, burst)
                cells.append(cell)
                summary = f"{report.format_rate(cell.rate)} decisions/s, {cell.usec_per_call:.2f} µs per {cell.command}"
            except Exception as exc:  # noqa: BLE001 - one broken cell must not lose the others
                failures.append((f"cost {label}", describe(exc)))
                summary = "failed"
            finally:
                close()
            bar.note(f"cost {label}: {summary}")
    finally:
        client.close()
        cleanup(url, prefix)
    return cells


@dataclass(frozen=True, slots=True)
class Settings:
    """What one run measures: where, how long per cell, how many keys, tasks and rounds."""

    url: str = DEFAULT_URL
    duration: float = DEFAULT_DURATION
    keys: int = DEFAULT_KEYS
    tasks: int = DEFAULT_TASKS
    rounds: int = 1
    """Every throughput and coalescing cell runs this many times, the rounds interleaved
    (all cells, then all cells again), and reports the round with the median rate."""
    hammer: bool = True
    coalescing: bool = True
    cost: bool = True
    cost_on_url: bool = False
    split: bool = True


def run_redis_bench(
    settings: Settings,
    scenarios: Sequence[str] | None,
    libraries: Sequence[str] | None,
    out: TextIO,
    progress: bool,
    *,
    progress_stream: TextIO | None = None,
) -> RedisBenchResult:
    """Measure everything chosen on the Redis at ``settings.url``; delete its keys at the end."""
    chosen_scenarios = choose(scenarios, SCENARIOS, "scenario")
    chosen_libraries = choose(["ratekeeper", *libraries] if libraries else None, LIBRARIES, "library")
    root = f"rkbench:{os.getpid()}-{secrets.token_hex(3)}:"
    result = RedisBenchResult(
        url=settings.url,
        duration=settings.duration,
        keys=settings.keys,
        tasks=settings.tasks,
        rounds=settings.rounds,
        scenarios=chosen_scenarios,
        libraries=chosen_libraries,
        python=f"Python {platform.python_version()} ({platform.python_implementation()}) on "
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
        load="load average at start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()),
        prefix=root,
    )
    import redis

    result.versions["redis-py"] = redis.__version__
    with redis.Redis.from_url(settings.url) as probe:
        result.versions["Redis server"] = str(probe.info("server").get("redis_version", "?"))

    measured: list[RedisSubject] = floor_subjects()
    for library in chosen_libraries:
        try:
            found = subjects(library)
            result.versions[library] = library_version(library)
        except ImportError as exc:
            result.skipped[library] = f"cannot import it: {describe(exc)}"
            continue
        measured += found
    result.calls.update({(s.library, s.algorithm): s.how for s in measured})

    def target(subj: RedisSubject, tag: str = "") -> Target:
        return Target(settings.url, f"{root}{subj.library}.{subj.algorithm}{tag}:")

    steps: list[tuple[str, Any]] = []
    for n in range(settings.rounds):
        round_tag = f" (round {n + 1}/{settings.rounds})" if settings.rounds > 1 else ""
        for mode in MODES:
            for scenario in chosen_scenarios:
                for subj in measured:
                    label = f"{mode} {scenario} {subj.library} {subj.algorithm}{round_tag}"
                    steps.append((label, ("cell", subj, scenario, mode)))
        if settings.coalescing:
            for tag, store_options in (("coalesced", {}), ("uncoalesced", UNBATCHED)):
                subj = ratekeeper_subject("gcra", store_options)
                steps.append((f"coalescing ratekeeper gcra {tag}{round_tag}", ("coalesce", subj, tag)))
    if settings.hammer:
        for subj in measured:
            if subj.library != "redis-py":
                steps.append((f"hammer {subj.library} {subj.algorithm}", ("hammer", subj)))

    if settings.cost:
        steps.append(("server cost", ("cost",)))
    if settings.split:
        steps.append(("asyncio split", ("split",)))

    many = _keys("many_keys", settings.keys)
    rounds: dict[tuple[str, str, str, str], list[Cell]] = {}
    bar = report.Progress(progress_stream or sys.stderr, len(steps), enabled=progress)
    pool: ProcessPoolExecutor | None = None
    try:
        for label, step in steps:
            bar.start(label)
            try:
                if step[0] == "cell":
                    _, subj, scenario, mode = step
                    keys = ["hot"] if scenario == "hot_key" else many
                    cell = _measure(subj, target(subj), scenario, mode, keys, settings)
                    rounds.setdefault(("cell", *_cell_id(cell)), []).append(cell)
                    summary = _summary(cell.sample)
                elif step[0] == "coalesce":
                    _, subj, tag = step
                    sample = asyncio.run(
                        _measure_async(subj, target(subj, tag), ["hot"], settings.duration, COALESCING_CALLERS)
                    )
                    cell = Cell(subj.library, tag, "hot_key", "async", (), sample)
                    rounds.setdefault(("coalesce", *_cell_id(cell)), []).append(cell)
                    summary = _summary(sample)
                elif step[0] == "cost":
                    with contextlib.ExitStack() as stack:
                        url = None if settings.cost_on_url else stack.enter_context(_private_redis())
                        result.cost_server = "a private redis-server" if url else f"`{settings.url}`"
                        result.costs = measure_costs(
                            url or settings.url, f"{root}cost:", settings.duration, bar, result.failures
                        )
                    summary = f"{len(result.costs)} cells on {result.cost_server}"
                elif step[0] == "split":
                    with contextlib.ExitStack() as stack:
                        url = None if settings.cost_on_url else stack.enter_context(_private_redis())
                        result.cost_server = "a private redis-server" if url else f"`{settings.url}`"
                        try:
                            result.split = measure_split(
                                url or settings.url,
                                f"{root}split:",
                                RATEKEEPER_ALGORITHMS,
                                {"hot_key": ["hot"], "many_keys": many},
                                settings.duration,
                                settings.tasks,
                                bar.note,
                            )
                        finally:
                            cleanup(url or settings.url, f"{root}split:")
                    result.split_floors = measure_floors(settings.duration, settings.tasks)
                    summary = f"{len(result.split)} cells on {result.cost_server}"
                else:
                    _, subj = step
                    if pool is None:
                        pool = _hammer_pool(chosen_libraries)
                    ham = _hammer(pool, subj, target(subj, "-hammer"))
                    result.hammer.append(ham)
                    summary = f"{ham.admitted} admitted of {ham.expected} expected, {ham.errors} errors"
            except Exception as exc:  # noqa: BLE001 - one broken cell must not lose the others
                result.failures.append((label, describe(exc)))
                bar.note(f"{label}: failed: {describe(exc)}")
                summary = "failed"
            bar.finish(label, summary)
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        cleanup(settings.url, root)
    for (kind, *_), cells in rounds.items():
        (result.cells if kind == "cell" else result.coalescing).append(_median(cells))

    out.write(result.to_markdown())
    out.flush()
    return result


def _cell_id(cell: Cell) -> tuple[str, str, str]:
    return cell.library, cell.algorithm, f"{cell.scenario} {cell.mode}"


def _median(cells: list[Cell]) -> Cell:
    """The round with the median rate (the lower middle one of an even count), with every round's rate."""
    middle = report.median_by(cells, lambda c: c.rate)
    return replace(middle, round_rates=tuple(c.rate for c in cells))


def _summary(sample: Sample) -> str:
    text = (
        f"{report.format_rate(sample.rate)} decisions/s, p50 {sample.p50_us:,.0f} µs, p99 {sample.p99_us:,.0f} µs, "
        f"{report.format_fraction(sample.allowed / sample.calls if sample.calls else 0.0)} allowed"
    )
    return text + (f", {sample.errors} errors ({sample.first_error})" if sample.errors else "")


# -- the report ---------------------------------------------------------------------------------


def _times(value: float, of: float) -> str:
    return f"{value / of:.2f}×" if of > 0 else "n/a"


def _spread(cell: Cell, rounds: int) -> str:
    if rounds <= 1:
        return ""
    low, high = min(cell.round_rates, default=0.0), max(cell.round_rates, default=0.0)
    return f" {report.format_rate(low)}–{report.format_rate(high)} |"


def render_markdown(result: RedisBenchResult) -> str:
    """Settings, one table per (mode, scenario), the coalescing table, the hammer table, notes."""
    versions = ", ".join(f"{lib} {v}" for lib, v in result.versions.items())
    out = [
        "## Redis store: ratekeeper and its peers on the same Redis",
        "",
        f"One run on `{result.url}`: {result.python}; {versions}; {result.load}.",
        f"Every cell runs {result.duration:g} s"
        + (
            f", {result.rounds} times, the rounds interleaved (every cell, then every cell again); the table shows "
            "the round with the median rate, and the range over the rounds,"
            if result.rounds > 1
            else ""
        )
        + f" under a limit of {SPEC} per key (nearly every call allowed, so "
        f"every library writes its state). *sync*: one thread, calls back to back; *async*: {result.tasks} "
        "asyncio tasks sharing one limiter. Latency is per call, timed with `perf_counter_ns`. *× floor*: the "
        "rate over the raw floor in the same table (one redis-py `EVALSHA` of `return 1` per call). *compared*: "
        "for ratekeeper, its rate over the best peer in the table (named); for a peer, its rate over "
        "ratekeeper's best comparable algorithm (named).",
        "",
    ]
    for mode in MODES:
        for scenario in result.scenarios:
            rows = result.rows(scenario, mode)
            if not rows:
                continue
            keys = "one key" if scenario == "hot_key" else f"{result.keys:,} keys round robin"
            how = "sync, one thread" if mode == "sync" else f"asyncio, {result.tasks} tasks"
            out += [
                f"### {how}: `{scenario}` ({keys})",
                "",
                "| library | algorithm | decisions/s | p50 µs | p99 µs | allowed | errors | × floor | compared |"
                + (" rounds: min–max/s |" if result.rounds > 1 else ""),
                "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
                + (" ---: |" if result.rounds > 1 else ""),
            ]
            floor = result.floor(scenario, mode)
            best_peer = result.best_peer(scenario, mode)
            for cell in rows:
                s = cell.sample
                versus = ""
                if cell.library == "ratekeeper" and best_peer is not None:
                    versus = (
                        f"{_times(cell.rate, best_peer.rate)} best peer ({best_peer.library} {best_peer.algorithm})"
                    )
                elif cell.library != "redis-py":
                    ref = result.best_ratekeeper(scenario, mode, cell.comparable)
                    versus = f"{_times(cell.rate, ref.rate)} ratekeeper {ref.algorithm}" if ref else "n/a"
                out.append(
                    f"| {cell.library} | {cell.algorithm} | {report.format_rate(cell.rate)} | {s.p50_us:,.0f} | "
                    f"{s.p99_us:,.0f} | {report.format_fraction(s.allowed / s.calls if s.calls else 0.0)} | "
                    f"{s.errors} | {_times(cell.rate, floor.rate) if floor else 'n/a'} | {versus} |"
                    + _spread(cell, result.rounds)
                )
            out.append("")
    if result.coalescing:
        out += [
            f"### Coalescing: one hot key, {COALESCING_CALLERS} concurrent async callers, ratekeeper gcra",
            "",
            "| ratekeeper | decisions/s | p50 µs | p99 µs | errors | × uncoalesced |"
            + (" rounds: min–max/s |" if result.rounds > 1 else ""),
            "| --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if result.rounds > 1 else ""),
        ]
        plain = next((c for c in result.coalescing if c.algorithm == "uncoalesced"), None)
        for cell in result.coalescing:
            s = cell.sample
            ratio = _times(cell.rate, plain.rate) if plain else "n/a"
            out.append(
                f"| {cell.algorithm} | {report.format_rate(cell.rate)} | {s.p50_us:,.0f} | {s.p99_us:,.0f} | "
                f"{s.errors} | {ratio} |" + _spread(cell, result.rounds)
            )
        out += ["", f"Uncoalesced means `Limiter(url, {', '.join(f'{k}={v!r}' for k, v in UNBATCHED.items())})`.", ""]
    if result.hammer:
        attempts = HAMMER_PROCESSES * HAMMER_THREADS * HAMMER_ATTEMPTS
        out += [
            f"### The hammer: {HAMMER_PROCESSES} processes × {HAMMER_THREADS} threads, one key, limit "
            f"{HAMMER_SPEC}, {attempts} attempts",
            "",
            "| library | algorithm | admitted | expected | errors | verdict |",
            "| --- | --- | ---: | ---: | ---: | --- |",
        ]
        for ham in result.hammer:
            if ham.admitted == ham.expected:
                verdict = "exact"
            elif ham.admitted > ham.expected:
                verdict = f"**over-admitted by {ham.admitted - ham.expected}**"
            else:
                verdict = f"**under-admitted by {ham.expected - ham.admitted}**"
            errors = f"{ham.errors} ({ham.first_error})" if ham.first_error else str(ham.errors)
            out.append(f"| {ham.library} | {ham.algorithm} | {ham.admitted} | {ham.expected} | {errors} | {verdict} |")
        out.append("")
    if result.costs:
        out += render_costs(result)
    if result.split:
        out += render_split(result.split, result.split_floors, result.tasks, result.cost_server)
    out += report.render_calls(result.calls, result.skipped, code=False)
    if result.failures:
        out += ["", "Steps that failed:", ""]
        out += [f"- {label}: {error}" for label, error in result.failures]
    out.append("")
    return "\n".join(out)


def render_costs(result: RedisBenchResult) -> list[str]:
    """The server-cost table: rate and Redis µs per decision, each over the floor of the
    command the decision ran (``FCALL`` or ``EVALSHA`` of ``return 1``)."""
    floors = {c.command: c for c in result.costs if c.subject.startswith("redis-py")}
    out = [
        f"### Redis CPU per decision, and the sliding log by length (sync, one thread, on {result.cost_server})",
        "",
        "Redis µs: `usec` over `calls` of the command each decision ran (`cmdstat_fcall`, or `cmdstat_evalsha` "
        "on a server without Functions) in `INFO commandstats` across the cell (the server's own time per "
        "call); *− floor*: over the same command returning 1. A sliding log *of L entries*: a limit of L per L ms "
        "and one call per ms of the call's own time (`store.decide(op, now)`), so each call expires one entry "
        f"and appends one; the log was full before the cell started. Other rows: `Limiter.try_acquire` under {SPEC}. "
        f"*Back to back*: the same call (the store's own) sent {BURST:,} times pipelined, the least µs per call of "
        f"{BURST_SAMPLES} samples: what a busy Redis pays (one call per round trip costs it more, and varies more).",
        "",
        "| subject | command | decisions/s | × floor | Redis µs per call | − floor µs | back to back µs | "
        "denied | errors |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for cell in result.costs:
        floor = floors.get(cell.command, result.costs[0])
        back = f"{cell.back_to_back:.2f}" if cell.back_to_back else ""
        out.append(
            f"| {cell.subject} | {cell.command} | {report.format_rate(cell.rate)} | {_times(cell.rate, floor.rate)} | "
            f"{cell.usec_per_call:.2f} | {cell.usec_per_call - floor.usec_per_call:+.2f} | {back} | {cell.denied} | "
            f"{cell.errors} |"
        )
    out.append("")
    return out


# -- command line -------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``ratekeeper bench redis`` to ``parser``."""
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the Redis to use (default {DEFAULT_URL})")
    add_common_options(
        parser, duration=DEFAULT_DURATION, quick_duration=QUICK_DURATION, keys=DEFAULT_KEYS, quick_keys=QUICK_KEYS
    )
    parser.add_argument(
        "--tasks", type=count(1), default=DEFAULT_TASKS, metavar="N", help=f"asyncio tasks (default {DEFAULT_TASKS})"
    )
    parser.add_argument(
        "--rounds",
        type=count(1),
        default=1,
        metavar="N",
        help="run every cell N times, interleaved, and report the median round (default 1)",
    )
    options.add_scenario_option(parser, SCENARIOS)
    options.add_peer_option(parser, "--library", "libraries", LIBRARIES[1:], LIBRARIES[1:])
    parser.add_argument("--no-hammer", action="store_false", dest="hammer", help="skip the 8-process hammer")
    parser.add_argument("--no-coalescing", action="store_false", dest="coalescing", help="skip the coalescing cells")
    parser.add_argument(
        "--no-cost", action="store_false", dest="cost", help="skip Redis CPU per decision and the sliding log by length"
    )
    parser.add_argument(
        "--no-split", action="store_false", dest="split", help="skip where an asyncio decision's time goes"
    )
    parser.add_argument(
        "--cost-on-url",
        action="store_true",
        help="measure Redis CPU per decision on --url, not on a private redis-server",
    )


def bench_from_args(args: argparse.Namespace, out: TextIO, progress_stream: TextIO | None = None) -> RedisBenchResult:
    """Run the benchmark as parsed by a parser given ``add_arguments``."""
    quick: bool = args.quick
    settings = Settings(
        url=args.url,
        duration=options.or_default(args.duration, quick, DEFAULT_DURATION, QUICK_DURATION),
        keys=options.or_default(args.keys, quick, DEFAULT_KEYS, QUICK_KEYS),
        tasks=args.tasks,
        rounds=args.rounds,
        hammer=args.hammer,
        coalescing=args.coalescing,
        cost=args.cost,
        cost_on_url=args.cost_on_url,
        split=args.split,
    )
    return run_redis_bench(
        settings, args.scenarios, args.libraries, out, args.progress, progress_stream=progress_stream
    )


def run(args: argparse.Namespace) -> int:
    """Run from parsed arguments: tables to standard output (and ``--markdown``); 1 if a step failed."""
    return finish(bench_from_args(args, sys.stdout), args.markdown)


def main(argv: Sequence[str] | None = None) -> int:
    return options.command_main(
        argv,
        "ratekeeper bench redis",
        "Compare ratekeeper's Redis store with limits, pyrate-limiter and throttled-py.",
        add_arguments,
        run,
    )


if __name__ == "__main__":
    raise SystemExit(main())
