"""The Redis store itself: URLs and options, key layout and expiry, the script's loading,
round trips per decision, coalescing that decides exactly as serial calls would.

Equality with the reference algorithms, trace by trace, is the conformance suite's job
(tests/conformance); these tests pin what only the Redis store has.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.errors import ConfigurationError, StoreError
from ratekeeper.op import Op
from ratekeeper.stores import wire
from ratekeeper.stores.redis.script import ALGORITHM_FILES, script_for
from ratekeeper.stores.redis.store import RedisStore
from ratekeeper.stores.redis.store_async import AsyncRedisStore
from ratekeeper.stores.redis.url import parse_redis_url

URL = "redis://127.0.0.1:6379/0"
EPOCH_US = 1_763_870_000_000_000


# -- URLs and options (no server needed) -------------------------------------------------


def test_standalone_urls_keep_their_database_and_tls() -> None:
    assert parse_redis_url("redis://:pw@h:6380/2").kind == "standalone"
    assert parse_redis_url("rediss://h:6380/0").ssl is True
    assert parse_redis_url("valkey://h/0").url == "redis://h/0"
    assert parse_redis_url("valkeys://h/0").url == "rediss://h/0"
    assert parse_redis_url("unix:///run/redis.sock?db=3").url == "unix:///run/redis.sock?db=3"


def test_sentinel_url_names_every_sentinel_the_service_and_the_database() -> None:
    target = parse_redis_url("redis+sentinel://:secret@10.0.0.1:26379,10.0.0.2:26380/mymaster/4")
    assert (target.kind, target.nodes, target.service, target.db, target.password) == (
        "sentinel",
        (("10.0.0.1", 26379), ("10.0.0.2", 26380)),
        "mymaster",
        4,
        "secret",
    )


def test_cluster_url_lists_its_seed_nodes() -> None:
    target = parse_redis_url("redis+cluster://a:7000,b:7001")
    assert (target.kind, target.nodes) == ("cluster", (("a", 7000), ("b", 7001)))


@pytest.mark.parametrize(
    ("url", "options", "says"),
    [
        ("redis+sentinel://h:1", {}, "service_name"),
        ("redis+cluster://h:1/0", {}, "no databases"),
        ("redis+sentinel://h:x/m", {}, "not a number"),
        ("redis://h/0", {"colour": "red"}, "accepted: prefix"),
        ("redis://h/0?batching=maybe", {}, "true or false"),
        ("redis://h/0", {"timeout": -1}, "timeout must be"),
        ("redis://h/0", {"prefix": "a{b"}, "braces"),
    ],
)
def test_bad_urls_and_options_are_refused_with_what_would_be_right(
    url: str, options: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says):
        RedisStore(url, **options)


def test_every_rule_of_one_key_shares_its_hash_slot() -> None:
    """The caller's key is the hash tag: on a Cluster, every rule of a key is one slot."""
    a = wire.storage_key("rk:", Rule("a", ["1/s"]).plan, "user-{42}")
    b = wire.storage_key("rk:", Rule("b", ["5/minute"], algorithm="sliding_window_log").plan, "user-{42}")
    assert a != b
    assert key_slot(a.encode()) == key_slot(b.encode())


def test_each_algorithm_script_holds_only_what_it_needs() -> None:
    """A call runs its algorithm's script, which defines no other algorithm (Redis executes
    every definition of a script on each call)."""
    for name in ALGORITHM_FILES:
        source = script_for([name]).source
        others = [o for o in ALGORITHM_FILES if o != name and f'ALGORITHMS["{o}"]' in source]
        assert f'ALGORITHMS["{name}"]' in source
        assert others == (["gcra"] if name == "leaky_bucket" else []), name
    assert script_for(["gcra", "fixed_window"]).sha == script_for(["fixed_window", "gcra"]).sha


# -- against the shared Redis ----------------------------------------------------------------


@pytest.fixture
def store(key_prefix: str) -> Iterator[RedisStore]:
    s = RedisStore(URL, prefix=f"{key_prefix}:")
    yield s
    s.close()


@pytest.fixture
def raw() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(URL)
    yield client
    client.close()


class _Counting:
    """Counts the script calls a store sends (each is one round trip) and their ops."""

    def __init__(self, store: Any) -> None:
        self.calls = 0
        self.ops = 0
        send = store.shell.call

        def counted(call: Any, client: Any = None) -> Any:
            self.calls += 1
            self.ops += int(call.args[2])
            return send(call, client)

        store.shell.call = counted


@pytest.mark.redis
def test_partner_rule_admits_one_per_three_seconds_on_the_server_clock(store: RedisStore) -> None:
    rule = Rule("partner.export", ["1/3s"])
    first = store.decide(Op.decide(rule.plan, "partner-7", 1))
    second = store.decide(Op.decide(rule.plan, "partner-7", 1))
    assert first.allowed and not second.allowed
    assert 2.9 < second.retry_after <= 3.0


@pytest.mark.redis
def test_state_expires_once_whole_and_is_never_kept_without_a_ttl(store: RedisStore, raw: redis.Redis) -> None:
    rule = Rule("ttl", ["10/100ms"], algorithm="sliding_window_log")
    store.decide(Op.decide(rule.plan, "k", 3))
    ttl = raw.pttl(store.planner.storage_key(rule.plan, "k"))
    # whole after 100 ms; the key lives at most a second longer (the margin for a clock step),
    # and a quarter of it more: the sliding log's appends set the TTL again only once it
    # falls short of that margin (sliding_window_log.lua), not on every call
    assert 1000 <= ttl <= 1350


@pytest.mark.redis
def test_reset_deletes_the_key(store: RedisStore, raw: redis.Redis) -> None:
    rule = Rule("reset", ["2/hour"])
    store.decide(Op.decide(rule.plan, "k", 2))
    store.reset(rule.plan, "k")
    assert raw.exists(store.planner.storage_key(rule.plan, "k")) == 0
    assert store.decide(Op.decide(rule.plan, "k", 2)).allowed


@pytest.mark.redis
def test_a_batch_over_several_rules_is_one_round_trip_and_all_or_nothing(store: RedisStore) -> None:
    per_user = Rule("msg.user", ["10/minute"], algorithm="token_bucket")
    per_ip = Rule("msg.ip", ["3/minute"], algorithm="gcra")
    counter = _Counting(store)
    refused = store.decide_many([Op.decide(per_user.plan, "u", 2), Op.decide(per_ip.plan, "ip", 4)], now=EPOCH_US)
    assert [d.allowed for d in refused] == [True, False]
    assert counter.calls == 1
    assert store.decide(Op.peek(per_user.plan, "u", 0), EPOCH_US).remaining == 10  # nothing charged


@pytest.mark.redis
def test_a_private_server_that_lost_its_scripts_gets_them_again(redis_server: Any) -> None:
    """After SCRIPT FLUSH (or a restart) the first call meets NOSCRIPT, loads the script
    and decides: the caller never sees it."""
    store = RedisStore(redis_server.url, prefix="rk:")
    rule = Rule("noscript", ["5/minute"])
    assert store.decide(Op.decide(rule.plan, "k", 1)).allowed
    client = redis.Redis.from_url(redis_server.url)
    client.script_flush()
    assert store.decide(Op.decide(rule.plan, "k", 1)).remaining == 3
    client.close()
    store.close()


@pytest.mark.redis
def test_an_unreachable_server_is_a_store_error_within_the_timeout() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = RedisStore(f"redis://127.0.0.1:{port}/0", timeout=0.2)
    started = time.monotonic()
    with pytest.raises(StoreError):
        store.decide(Op.decide(Rule("down", ["1/s"]).plan, "k", 1))
    assert time.monotonic() - started < 1.0  # the refused connect, retried twice with backoff
    store.close()


# -- coalescing ------------------------------------------------------------------------------


def _serial(rule: Rule, costs: list[int], now: int) -> list[Any]:
    state = None
    out = []
    for cost in costs:
        state, decision = rule.plan.decide(state, now, cost, None, None)
        out.append(decision)
    return out


@pytest.mark.redis
def test_concurrent_async_calls_on_one_key_coalesce_and_decide_as_serial_calls(key_prefix: str) -> None:
    rule = Rule("hot", ["40/minute"], algorithm="token_bucket", burst=50)
    costs = [1 + i % 3 for i in range(100)]

    async def run() -> tuple[list[Any], int]:
        store = AsyncRedisStore(URL, prefix=f"{key_prefix}:", max_in_flight=1)
        counter = _Counting(store)
        decisions = await asyncio.gather(*(store.decide(Op.decide(rule.plan, "k", c), EPOCH_US) for c in costs))
        await store.aclose()
        return list(decisions), counter.calls

    decisions, calls = asyncio.run(run())
    assert decisions == _serial(rule, costs, EPOCH_US)
    assert calls <= 2  # 100 decisions in one or two round trips


@pytest.mark.redis
def test_concurrent_threads_on_one_key_coalesce_and_admit_exactly_the_limit(key_prefix: str) -> None:
    store = RedisStore(URL, prefix=f"{key_prefix}:", max_in_flight=1)
    counter = _Counting(store)
    rule = Rule("hot", ["100/day"], algorithm="gcra")
    admitted: list[bool] = []
    lock = threading.Lock()

    def hammer() -> None:
        for _ in range(40):
            ok = store.decide(Op.decide(rule.plan, "k", 1)).allowed
            with lock:
                admitted.append(ok)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    assert (len(admitted), sum(admitted)) == (320, 100)
    assert counter.ops == 320
    assert counter.calls < 320  # queued callers shared round trips


@pytest.mark.redis
def test_async_calls_for_many_keys_in_one_tick_share_one_round_trip(key_prefix: str) -> None:
    rule = Rule("many", ["5/minute"], algorithm="fixed_window")

    async def run() -> tuple[list[bool], int]:
        async with AsyncLimiter(URL, prefix=f"{key_prefix}:", max_in_flight=1) as limiter:
            counter = _Counting(limiter.store)
            got = await asyncio.gather(*(limiter.try_acquire(rule, f"user-{i}") for i in range(200)))
            return [bool(d) for d in got], counter.calls

    allowed, calls = asyncio.run(run())
    assert allowed == [True] * 200
    assert calls <= 2


@pytest.mark.redis
def test_coalescing_can_be_turned_off(key_prefix: str) -> None:
    with Limiter(URL, prefix=f"{key_prefix}:", batching=False) as limiter:
        assert limiter.store.planner.batching is False
        assert limiter.try_acquire(Rule("off", ["1/s"]), "k")
