"""Adapters that put ratekeeper and its in-memory peers behind one shape.

Every subject (a library and one of its algorithms) builds a ``Runner`` for a limit
and a key count. ``Runner.loop(keys, n)`` makes ``n`` decisions for the next ``n``
keys of an iterator and returns how many were allowed. Each library gets its own loop
with its cheapest correct synchronous call inlined, so no adapter pays for a wrapper
call the others do not:

- ratekeeper: ``Limiter("memory://").try_acquire(rule, key)`` (a ``Decision``, truthy
  when allowed).
- limits: ``<Strategy>RateLimiter(MemoryStorage()).hit(item, key)``.
- pyrate-limiter: ``Limiter(factory).try_acquire(key, 1, False)``: never blocks, returns
  False at once. One ``Limiter`` over one bucket limits *all* names together, so
  per-key limiting needs a ``BucketFactory`` that gives every name its own bucket
  (the pattern of its README): ``InMemoryBucket`` for the log algorithms (registered
  with the background leaker that trims them), ``StateBucket`` for GCRA and token
  bucket (constant state, nothing to leak, so not registered).
- throttled-py: ``Throttled(using=..., quota=..., store=MemoryStore(...), timeout=-1)
  .limit(key).limited``, with the store's ``MAX_SIZE`` raised above the key count
  (the default of 1024 would evict keys and turn denials into admissions).

The peers are imported only when a subject of theirs is built, so a missing peer
makes that library unavailable instead of breaking the benchmark.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from itertools import islice
from typing import Any

from ratekeeper.algorithms import ALGORITHMS

__all__ = [
    "LIBRARIES",
    "LIBRARY_ALIASES",
    "LIMITS_STRATEGIES",
    "RATEKEEPER_ALGORITHMS",
    "LimitSpec",
    "Loop",
    "Runner",
    "Subject",
    "library_version",
    "store_capacity",
    "subjects",
]

Loop = Callable[[Iterator[str], int], int]
"""``loop(keys, n)``: make ``n`` decisions for the next ``n`` keys; return how many were allowed."""

LIBRARIES = ("ratekeeper", "limits", "pyrate-limiter", "throttled-py")
LIBRARY_ALIASES = {"pyrate": "pyrate-limiter", "pyrate_limiter": "pyrate-limiter", "throttled": "throttled-py"}

RATEKEEPER_ALGORITHMS = tuple(name for name, algorithm in ALGORITHMS.items() if not algorithm.uses_leases)
"""ratekeeper's algorithms that answer a plain decision (``concurrency`` hands out leases
that the caller must release, which no peer offers, so it is not measured)."""

_BUCKETS = ("gcra", "token_bucket")
"""GCRA and the token bucket admit exactly the same requests: each peer's bucket-style
algorithm is compared with the faster of ratekeeper's two."""

LIMITS_STRATEGIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("fixed_window", "FixedWindowRateLimiter", ("fixed_window",)),
    ("moving_window", "MovingWindowRateLimiter", ("sliding_window_log",)),
    ("sliding_window_counter", "SlidingWindowCounterRateLimiter", ("sliding_window_counter",)),
)
"""limits' strategies: the name a table shows, the limiter class and the ratekeeper
algorithms it is compared with."""

_MODULES = {
    "ratekeeper": "ratekeeper",
    "limits": "limits",
    "pyrate-limiter": "pyrate_limiter",
    "throttled-py": "throttled",
}


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """``count`` per ``period`` whole seconds (limits and throttled-py take whole seconds)."""

    count: int
    period: int

    def __str__(self) -> str:
        return f"{self.count}/{self.period}s"


@dataclass(slots=True)
class Runner:
    """A built limiter: ``loop`` decides, ``settle`` waits for background work, ``close`` frees it."""

    loop: Loop
    close: Callable[[], None] = field(default=lambda: None)
    settle: Callable[[], None] = field(default=lambda: None)


@dataclass(frozen=True, slots=True)
class Subject:
    """One library with one algorithm, as the library names it.

    ``comparable`` lists the ratekeeper algorithms that admit the same requests; a peer
    is compared with the fastest (or smallest) of them. ``how`` says what is called.
    """

    library: str
    algorithm: str
    comparable: tuple[str, ...]
    build: Callable[[LimitSpec, int], Runner]
    how: str


def store_capacity(n_keys: int) -> int:
    """A store bound comfortably above ``n_keys`` (some algorithms use two entries per key)."""
    return 4 * n_keys + 1024


def library_version(library: str) -> str:
    """The installed version of ``library``, ``"dev"`` for an uninstalled ratekeeper checkout."""
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        module = importlib.import_module(_MODULES[library])
        return str(getattr(module, "__version__", "dev"))


def subjects(library: str) -> list[Subject]:
    """The subjects of ``library``; raises ``ImportError`` when it cannot be imported."""
    importlib.import_module(_MODULES[library])
    if library == "ratekeeper":
        return [
            Subject(
                "ratekeeper",
                algorithm,
                (algorithm,),
                partial(_build_ratekeeper, algorithm),
                f'Limiter("memory://").try_acquire(Rule(..., algorithm="{algorithm}"), key)',
            )
            for algorithm in RATEKEEPER_ALGORITHMS
        ] + [
            Subject(
                "ratekeeper",
                "gcra+observer",
                ("gcra",),
                partial(_build_ratekeeper, "gcra", observed=True),
                'Limiter("memory://", observer=<an Observer that does nothing>).try_acquire(Rule(..., "gcra"), key)',
            )
        ]
    if library == "limits":
        return [
            Subject(
                "limits",
                name,
                comparable,
                partial(_build_limits, strategy),
                f"{strategy}(MemoryStorage()).hit(item, key)",
            )
            for name, strategy, comparable in LIMITS_STRATEGIES
        ]
    if library == "pyrate-limiter":
        return [
            Subject(
                "pyrate-limiter",
                name,
                comparable,
                partial(_build_pyrate, bucket, algorithm),
                f"Limiter(per-key factory of {bucket}(algorithm={algorithm}())).try_acquire(key, 1, False)",
            )
            for name, bucket, algorithm, comparable in (
                ("sliding_window_log", "InMemoryBucket", "SlidingWindowLog", ("sliding_window_log",)),
                ("fixed_window", "InMemoryBucket", "FixedWindow", ("fixed_window",)),
                ("gcra", "StateBucket", "GCRA", _BUCKETS),
                ("token_bucket", "StateBucket", "TokenBucket", _BUCKETS),
            )
        ]
    if library == "throttled-py":
        return [
            Subject(
                "throttled-py",
                using,
                comparable,
                partial(_build_throttled, using),
                f'Throttled(using="{using}", store=MemoryStore(...), timeout=-1).limit(key).limited',
            )
            for using, comparable in (
                ("fixed_window", ("fixed_window",)),
                ("sliding_window", ("sliding_window_counter",)),
                ("token_bucket", _BUCKETS),
                ("leaking_bucket", ("leaky_bucket", *_BUCKETS)),
                ("gcra", _BUCKETS),
            )
        ]
    raise ValueError(f"unknown library {library!r}; choose one of: {', '.join(LIBRARIES)}")


def _closer(obj: object) -> Callable[[], None]:
    close = getattr(obj, "close", None)

    def call() -> None:
        if callable(close):
            close()

    return call


# -- ratekeeper ---------------------------------------------------------------------------


class _NullObserver:
    """An observer that keeps nothing: what attaching one costs, apart from its own work."""

    def decided(self, decision: object) -> None:
        pass

    def store_call(self, seconds: float, error: object) -> None:
        pass

    def breaker_changed(self, old: str, new: str) -> None:
        pass


def _build_ratekeeper(algorithm: str, spec: LimitSpec, n_keys: int, *, observed: bool = False) -> Runner:
    from ratekeeper import Limiter, Rule

    # At least the default bound (a million keys), so no run evicts a key it still uses.
    limiter = Limiter(
        "memory://", max_keys=max(1_000_000, store_capacity(n_keys)), observer=_NullObserver() if observed else None
    )
    rule = Rule("bench", [str(spec)], algorithm=algorithm)
    acquire = limiter.try_acquire

    def loop(keys: Iterator[str], n: int) -> int:
        allowed = 0
        for key in islice(keys, n):
            if acquire(rule, key):
                allowed += 1
        return allowed

    return Runner(loop, _closer(limiter))


# -- limits -------------------------------------------------------------------------------


def _build_limits(strategy: str, spec: LimitSpec, n_keys: int) -> Runner:
    import limits.strategies
    from limits import RateLimitItemPerSecond
    from limits.storage import MemoryStorage

    storage = MemoryStorage()
    limiter = getattr(limits.strategies, strategy)(storage)
    item = RateLimitItemPerSecond(spec.count, spec.period)
    hit = limiter.hit

    def loop(keys: Iterator[str], n: int) -> int:
        allowed = 0
        for key in islice(keys, n):
            if hit(item, key):
                allowed += 1
        return allowed

    def settle() -> None:
        # The storage sweeps expired entries on a 10 ms timer that re-arms while calls
        # arrive; let the last sweep finish so it is not caught half-way.
        timer: threading.Timer = storage.timer
        if timer.is_alive():
            timer.join(timeout=5.0)

    def close() -> None:
        storage.timer.cancel()
        settle()

    return Runner(loop, close, settle)


# -- pyrate-limiter -----------------------------------------------------------------------

_pyrate_factory: type[Any] | None = None


def _pyrate_factory_class() -> type[Any]:
    """A ``BucketFactory`` giving every name its own bucket (defined on first use)."""
    global _pyrate_factory  # noqa: PLW0603 - a class built once, after the optional import
    if _pyrate_factory is not None:
        return _pyrate_factory

    from pyrate_limiter import AbstractBucket, BucketFactory, MonotonicClock, RateItem

    class PerKeyFactory(BucketFactory):
        def __init__(self, new_bucket: Callable[[], AbstractBucket], leak: bool) -> None:
            self._new_bucket = new_bucket
            self._leak = leak
            self._clock = MonotonicClock()
            self.buckets: dict[str, AbstractBucket] = {}

        def wrap_item(self, name: str, weight: int = 1) -> RateItem:
            return RateItem(name, self._clock.now(), weight=weight)

        def get(self, item: RateItem) -> AbstractBucket:
            bucket = self.buckets.get(item.name)
            if bucket is None:
                bucket = self._new_bucket()
                if self._leak:
                    self.schedule_leak(bucket)
                self.buckets[item.name] = bucket
            return bucket

        def owned_buckets(self) -> list[AbstractBucket]:
            return list(self.buckets.values())

    _pyrate_factory = PerKeyFactory
    return PerKeyFactory


def _build_pyrate(bucket_kind: str, algorithm: str, spec: LimitSpec, n_keys: int) -> Runner:
    import pyrate_limiter
    from pyrate_limiter import Limiter, Rate

    rates = [Rate(spec.count, spec.period * 1000)]
    bucket_cls = getattr(pyrate_limiter, bucket_kind)
    algorithm_cls = getattr(pyrate_limiter, algorithm)

    def new_bucket() -> Any:
        return bucket_cls(rates, algorithm=algorithm_cls())

    factory = _pyrate_factory_class()(new_bucket, leak=bucket_kind == "InMemoryBucket")
    limiter = Limiter(factory)
    try_acquire = limiter.try_acquire

    def loop(keys: Iterator[str], n: int) -> int:
        allowed = 0
        for key in islice(keys, n):
            if try_acquire(key, 1, False):
                allowed += 1
        return allowed

    return Runner(loop, limiter.close)


# -- throttled-py -------------------------------------------------------------------------


def _build_throttled(using: str, spec: LimitSpec, n_keys: int) -> Runner:
    from throttled import MemoryStore, Throttled, per_duration

    store = MemoryStore(options={"MAX_SIZE": store_capacity(n_keys)})
    throttle = Throttled(
        using=using,
        quota=per_duration(timedelta(seconds=spec.period), spec.count),
        store=store,
        timeout=-1,
    )
    limit = throttle.limit

    def loop(keys: Iterator[str], n: int) -> int:
        allowed = 0
        for key in islice(keys, n):
            if not limit(key).limited:
                allowed += 1
        return allowed

    return Runner(loop)
