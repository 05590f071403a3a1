"""ratekeeper's Redis store and its peers' Redis backends behind one shape.

Every subject (a library and one of its algorithms) builds a ``SyncRunner`` and an
``AsyncRunner`` for a limit, on a ``Target`` (the Redis URL and a key prefix of its own).
Each library is called the way its documentation recommends, with its best
configuration for a shared Redis:

- ratekeeper: ``Limiter(url, prefix=...)`` / ``AsyncLimiter(...)``, ``try_acquire(rule,
  key)``; coalescing and auto-pipelining as shipped (on by default).
- redis-py, the raw floor: one ``EVALSHA`` of a script that returns 1, or one ``INCR``,
  per call; a sync client on one connection, ``redis.asyncio`` with its pool.
- limits: ``storage_from_string("redis://...")`` with ``FixedWindowRateLimiter`` /
  ``MovingWindowRateLimiter`` / ``SlidingWindowCounterRateLimiter``, ``hit(item, key)``;
  async: ``limits.aio`` with ``implementation="redispy"`` (coredis is not installed).
- pyrate-limiter: a ``BucketFactory`` giving every key its own bucket: ``RedisBucket``
  (a sorted set; sliding window log, fixed window) or ``StateBucket(store=
  RedisStateStore(...))`` (GCRA, token bucket), all on one shared client and
  ``WallClock`` (its advice for state shared between processes);
  ``Limiter(factory).try_acquire(key, 1, False)``, awaited when the client is async.
  The sorted sets are not trimmed by the leaker thread during a cell (their keys are
  deleted at the end).
- throttled-py: ``Throttled(using=..., quota=..., store=RedisStore(server=url),
  timeout=-1, key_prefix=...).limit(key).limited``; ``throttled.asyncio`` for async.

Peers are imported when their subject is built, so a missing peer only removes its rows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from ratekeeper_bench.latency import AsyncRunner, SyncRunner, Target, async_runner
from ratekeeper_bench.peers import LIMITS_STRATEGIES, LimitSpec

__all__ = [
    "LIBRARIES",
    "RATEKEEPER_ALGORITHMS",
    "UNBATCHED",
    "RedisSubject",
    "floor_subjects",
    "subject",
    "subjects",
]

LIBRARIES = ("ratekeeper", "limits", "pyrate-limiter", "throttled-py")

RATEKEEPER_ALGORITHMS = ("gcra", "token_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter")

UNBATCHED: dict[str, Any] = {"batching": False, "max_connections": 128}
"""The ``Limiter`` options that turn coalescing and auto-pipelining off (the coalescing cell), with
connections enough for 100 concurrent callers (the pool refuses a call beyond its size)."""

_BUCKETS = ("gcra", "token_bucket")

SyncBuild = Callable[[Target, LimitSpec], SyncRunner]
AsyncBuild = Callable[[Target, LimitSpec], Awaitable[AsyncRunner]]


@dataclass(frozen=True, slots=True)
class RedisSubject:
    """One library with one algorithm; ``comparable`` names ratekeeper's equivalents."""

    library: str
    algorithm: str
    comparable: tuple[str, ...]
    build: SyncBuild
    abuild: AsyncBuild
    how: str


# -- the raw floor ----------------------------------------------------------------------------

_TRIVIAL = "return 1"


def _floor_sync(command: str, target: Target, spec: LimitSpec) -> SyncRunner:
    import redis

    client: Any = redis.Redis.from_url(target.url, single_connection_client=True)
    if command == "EVALSHA":
        sha = client.script_load(_TRIVIAL)
        evalsha = client.evalsha

        def decide(key: str) -> bool:
            return bool(evalsha(sha, 1, target.prefix + key) == 1)

    else:
        incr = client.incr

        def decide(key: str) -> bool:
            return bool(incr(target.prefix + key) > 0)

    return SyncRunner(decide, client.close)


async def _floor_async(command: str, target: Target, spec: LimitSpec) -> AsyncRunner:
    import redis.asyncio

    client: Any = redis.asyncio.Redis.from_url(target.url)
    if command == "EVALSHA":
        sha = await client.script_load(_TRIVIAL)
        evalsha = client.evalsha

        async def decide(key: str) -> bool:
            return bool(await evalsha(sha, 1, target.prefix + key) == 1)

    else:
        incr = client.incr

        async def decide(key: str) -> bool:
            return bool(await incr(target.prefix + key) > 0)

    return async_runner(decide, client.aclose)


def floor_subjects() -> list[RedisSubject]:
    """The raw floor: one redis-py round trip per call (``EVALSHA`` of a trivial script, ``INCR``)."""
    return [
        RedisSubject(
            "redis-py",
            command,
            (),
            partial(_floor_sync, command),
            partial(_floor_async, command),
            f"one `{command}` per call: `Redis(single_connection_client=True)`; `redis.asyncio.Redis` (pooled)",
        )
        for command in ("EVALSHA", "INCR")
    ]


# -- ratekeeper -------------------------------------------------------------------------------


def _rule(algorithm: str, spec: LimitSpec) -> Any:
    from ratekeeper import Rule

    return Rule("bench", [str(spec)], algorithm=algorithm)


def _rk_sync(algorithm: str, options: dict[str, Any], target: Target, spec: LimitSpec) -> SyncRunner:
    from ratekeeper import Limiter

    limiter = Limiter(target.url, prefix=target.prefix, **options)
    rule = _rule(algorithm, spec)
    acquire = limiter.try_acquire

    def decide(key: str) -> bool:
        return acquire(rule, key).allowed

    return SyncRunner(decide, limiter.close)


async def _rk_async(algorithm: str, options: dict[str, Any], target: Target, spec: LimitSpec) -> AsyncRunner:
    from ratekeeper import AsyncLimiter

    limiter = AsyncLimiter(target.url, prefix=target.prefix, **options)
    rule = _rule(algorithm, spec)
    acquire = limiter.try_acquire

    async def decide(key: str) -> bool:
        return (await acquire(rule, key)).allowed

    return async_runner(decide, limiter.aclose)


def ratekeeper_subject(algorithm: str, options: dict[str, Any] | None = None) -> RedisSubject:
    """ratekeeper with ``algorithm``; ``options`` go to the ``Limiter`` (``UNBATCHED`` for the coalescing cell)."""
    opts = dict(options or {})
    extra = "".join(f", {k}={v!r}" for k, v in opts.items())
    return RedisSubject(
        "ratekeeper",
        algorithm,
        (algorithm,),
        partial(_rk_sync, algorithm, opts),
        partial(_rk_async, algorithm, opts),
        f'`Limiter(url, prefix=...{extra}).try_acquire(Rule(..., algorithm="{algorithm}"), key)`; `AsyncLimiter` alike',
    )


# -- limits -----------------------------------------------------------------------------------


def _limits_sync(strategy: str, target: Target, spec: LimitSpec) -> SyncRunner:
    import limits.strategies
    from limits import RateLimitItemPerSecond
    from limits.storage import RedisStorage

    storage = RedisStorage(target.url, key_prefix=target.prefix + "limits")
    hit = getattr(limits.strategies, strategy)(storage).hit
    item = RateLimitItemPerSecond(spec.count, spec.period)

    def decide(key: str) -> bool:
        return bool(hit(item, key))

    def close() -> None:
        storage.storage.close()

    return SyncRunner(decide, close)


async def _limits_async(strategy: str, target: Target, spec: LimitSpec) -> AsyncRunner:
    import limits.aio.strategies
    from limits import RateLimitItemPerSecond
    from limits.aio.storage import RedisStorage

    storage = RedisStorage("async+" + target.url, implementation="redispy", key_prefix=target.prefix + "limits")
    hit = getattr(limits.aio.strategies, strategy)(storage).hit
    item = RateLimitItemPerSecond(spec.count, spec.period)

    async def decide(key: str) -> bool:
        return bool(await hit(item, key))

    async def aclose() -> None:
        client = getattr(storage.bridge, "storage", None)
        if client is not None:
            await client.aclose()

    return async_runner(decide, aclose)


# -- pyrate-limiter ---------------------------------------------------------------------------

_factory_class: type[Any] | None = None


def _per_key_factory() -> type[Any]:
    """A ``BucketFactory`` that gives every key its own bucket from ``new_bucket(key)``."""
    global _factory_class  # noqa: PLW0603 - a class built once, after the optional import
    if _factory_class is None:
        from pyrate_limiter import AbstractBucket, BucketFactory, RateItem, WallClock

        class PerKeyFactory(BucketFactory):
            def __init__(self, new_bucket: Callable[[str], AbstractBucket]) -> None:
                self._new_bucket = new_bucket
                self._clock = WallClock()
                self.buckets: dict[str, AbstractBucket] = {}

            def wrap_item(self, name: str, weight: int = 1) -> RateItem:
                return RateItem(name, self._clock.now(), weight=weight)

            def get(self, item: RateItem) -> AbstractBucket:
                bucket = self.buckets.get(item.name)
                if bucket is None:
                    bucket = self.buckets[item.name] = self._new_bucket(item.name)
                return bucket

        _factory_class = PerKeyFactory
    return _factory_class


def _pyrate_bucket_maker(
    algorithm: str, client: Any, sha: str, target: Target, spec: LimitSpec
) -> Callable[[str], Any]:
    import pyrate_limiter
    from pyrate_limiter import Rate, RedisBucket, RedisStateStore, StateBucket

    rates = [Rate(spec.count, spec.period * 1000)]
    algorithm_cls = getattr(pyrate_limiter, algorithm)
    if algorithm in ("SlidingWindowLog", "FixedWindow"):
        return lambda key: RedisBucket(rates, client, f"{target.prefix}{key}", sha, algorithm=algorithm_cls())
    return lambda key: StateBucket(
        rates, algorithm=algorithm_cls(), store=RedisStateStore(client, f"{target.prefix}{key}")
    )


def _pyrate_sync(algorithm: str, target: Target, spec: LimitSpec) -> SyncRunner:
    import redis
    from pyrate_limiter import Limiter
    from pyrate_limiter.buckets.redis_bucket import LuaScript

    client: Any = redis.Redis.from_url(target.url)
    sha = client.script_load(LuaScript.PUT_ITEM)
    limiter = Limiter(_per_key_factory()(_pyrate_bucket_maker(algorithm, client, sha, target, spec)))
    try_acquire = limiter.try_acquire

    def decide(key: str) -> bool:
        return bool(try_acquire(key, 1, False))

    def close() -> None:
        limiter.close()
        client.close()

    return SyncRunner(decide, close)


async def _pyrate_async(algorithm: str, target: Target, spec: LimitSpec) -> AsyncRunner:
    import redis.asyncio
    from pyrate_limiter import Limiter
    from pyrate_limiter.buckets.redis_bucket import LuaScript

    client: Any = redis.asyncio.Redis.from_url(target.url)
    sha = await client.script_load(LuaScript.PUT_ITEM)
    limiter = Limiter(_per_key_factory()(_pyrate_bucket_maker(algorithm, client, sha, target, spec)))
    try_acquire = limiter.try_acquire

    async def decide(key: str) -> bool:
        return bool(await try_acquire(key, 1, False))  # type: ignore[misc]

    async def aclose() -> None:
        limiter.close()
        await client.aclose()

    return async_runner(decide, aclose)


# -- throttled-py -----------------------------------------------------------------------------


def _throttled_options(using: str, target: Target, spec: LimitSpec, per_duration: Any) -> dict[str, Any]:
    """``Throttled``'s arguments but the store, alike for its sync and asyncio classes
    (``per_duration`` is the quota factory of the one in use)."""
    return {
        "using": using,
        "quota": per_duration(timedelta(seconds=spec.period), spec.count),
        "timeout": -1,
        "key_prefix": target.prefix + "throttled",
    }


def _throttled_sync(using: str, target: Target, spec: LimitSpec) -> SyncRunner:
    from throttled import RedisStore, Throttled, per_duration

    store = RedisStore(server=target.url)
    throttle = Throttled(store=store, **_throttled_options(using, target, spec, per_duration))
    limit = throttle.limit

    def decide(key: str) -> bool:
        return not limit(key).limited

    def close() -> None:
        # throttled-py keeps its connection pools in a class-level cache and never closes them.
        client: Any = store._backend.get_client()
        client.connection_pool.disconnect()

    return SyncRunner(decide, close)


async def _throttled_async(using: str, target: Target, spec: LimitSpec) -> AsyncRunner:
    from throttled.asyncio import RedisStore, Throttled, per_duration

    store = RedisStore(server=target.url)
    throttle = Throttled(store=store, **_throttled_options(using, target, spec, per_duration))
    limit = throttle.limit

    async def decide(key: str) -> bool:
        return not (await limit(key)).limited

    async def aclose() -> None:
        # The pool is cached class-wide and bound to this event loop: close its connections.
        client: Any = store._backend.get_client()
        await client.connection_pool.disconnect()

    return async_runner(decide, aclose)


# -- the registry -----------------------------------------------------------------------------


def subjects(library: str) -> list[RedisSubject]:
    """Every algorithm of ``library`` on Redis (raises ImportError when the peer is missing)."""
    if library == "ratekeeper":
        return [ratekeeper_subject(algorithm) for algorithm in RATEKEEPER_ALGORITHMS]
    if library == "limits":
        import limits  # noqa: F401 - fail early when missing

        return [
            RedisSubject(
                "limits",
                name,
                comparable,
                partial(_limits_sync, strategy),
                partial(_limits_async, strategy),
                f"`{strategy}(RedisStorage(url)).hit(item, key)`; `limits.aio` alike (redispy)",
            )
            for name, strategy, comparable in LIMITS_STRATEGIES
        ]
    if library == "pyrate-limiter":
        import pyrate_limiter  # noqa: F401

        return [
            RedisSubject(
                "pyrate-limiter",
                name,
                comparable,
                partial(_pyrate_sync, algorithm),
                partial(_pyrate_async, algorithm),
                f"`Limiter(per-key factory of {bucket}).try_acquire(key, 1, False)`, algorithm={algorithm}()",
            )
            for name, algorithm, bucket, comparable in (
                ("sliding_window_log", "SlidingWindowLog", "RedisBucket", ("sliding_window_log",)),
                ("fixed_window", "FixedWindow", "RedisBucket", ("fixed_window",)),
                ("gcra", "GCRA", "StateBucket(store=RedisStateStore)", _BUCKETS),
                ("token_bucket", "TokenBucket", "StateBucket(store=RedisStateStore)", _BUCKETS),
            )
        ]
    if library == "throttled-py":
        import throttled  # noqa: F401

        return [
            RedisSubject(
                "throttled-py",
                using,
                comparable,
                partial(_throttled_sync, using),
                partial(_throttled_async, using),
                f'`Throttled(using="{using}", store=RedisStore(server=url), timeout=-1).limit(key).limited`; '
                "`throttled.asyncio` alike",
            )
            for using, comparable in (
                ("fixed_window", ("fixed_window",)),
                ("sliding_window", ("sliding_window_counter",)),
                ("token_bucket", _BUCKETS),
                ("leaking_bucket", _BUCKETS),
                ("gcra", _BUCKETS),
            )
        ]
    raise ValueError(f"unknown library {library!r}; choose one of: {', '.join(LIBRARIES)}")


def subject(library: str, algorithm: str) -> RedisSubject:
    """The subject of ``library`` named ``algorithm`` (used by the hammer's worker processes)."""
    for found in subjects(library):
        if found.algorithm == algorithm:
            return found
    raise ValueError(f"{library} has no algorithm {algorithm!r} in this benchmark")
