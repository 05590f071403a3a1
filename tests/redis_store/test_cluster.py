"""The Redis store on a Redis Cluster (a private 3-master cluster shared by the session):
decisions are exact on keys served by every master, a batch over several slots is all or
nothing, and every rule of one key lives in that key's slot, so one call serves them all.
Resharding (on a cluster of this module's own) moves a key's state with its slot: the limiter
follows MOVED and ASK redirections and stays exact while the slot moves under load.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.stores import wire
from server_fixtures import start_or_skip
from servers import RedisCluster, RedisServer

pytestmark = pytest.mark.redis

EPOCH_US = 1_763_870_000_000_000  # an explicit store clock: no decision depends on timing
EXACT = ["fixed_window", "sliding_window_log", "token_bucket", "gcra"]


def keys_on_each_node(cluster: RedisCluster, stem: str) -> dict[int, str]:
    """One key per master (node port -> key): the store's hash tag is the key itself."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < len(cluster.nodes):
        key = f"{stem}-{i}"
        found.setdefault(cluster.node_for_slot(key_slot(key.encode())).port, key)
        i += 1
    return found


def script_calls(node: RedisServer) -> tuple[int, int]:
    """How many decision calls (FCALL or EVALSHA) the node has run, and how many times it
    was asked which keys a command names (COMMAND GETKEYS: a round trip of its own)."""
    with node.client() as conn:
        stats: dict[str, Any] = conn.info("commandstats")
    calls = sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha"))
    return calls, int(stats.get("cmdstat_command|getkeys", {}).get("calls", 0))


@pytest.fixture(scope="module")
def reshard_cluster() -> Iterator[RedisCluster]:
    """A cluster of this module's own, whose slots the resharding tests move (each test
    finds the current owner, so they need no fresh cluster each)."""
    with start_or_skip(RedisCluster) as cluster:
        yield cluster


@pytest.fixture
def limiter(redis_cluster_url: str, key_prefix: str) -> Iterator[Limiter]:
    with Limiter(redis_cluster_url, prefix=f"{key_prefix}:") as lim:
        yield lim


@pytest.mark.parametrize("algorithm", EXACT)
def test_keys_on_every_master_each_admit_exactly_their_limit(
    redis_cluster: RedisCluster, limiter: Limiter, key_prefix: str, algorithm: str
) -> None:
    rule = Rule("api", ["3/minute"], algorithm=algorithm)
    keys = keys_on_each_node(redis_cluster, "user")
    assert len(keys) == 3
    for port, key in keys.items():
        admitted = [limiter.try_acquire(rule, key, now=EPOCH_US).allowed for _ in range(4)]
        assert admitted == [True, True, True, False], f"key {key} on node {port}"
        stored = wire.storage_key(f"{key_prefix}:", rule.plan, key)
        with redis_cluster.node_for_key(stored).client() as conn:
            assert redis_cluster.node_for_key(stored).port == port
            assert conn.exists(stored) == 1  # the state lives on the node that serves the key


def test_async_limiter_decides_on_every_master(
    redis_cluster: RedisCluster, redis_cluster_url: str, key_prefix: str
) -> None:
    rule = Rule("api", ["2/minute"], algorithm="token_bucket")
    keys = list(keys_on_each_node(redis_cluster, "async-user").values())

    async def main() -> list[list[bool]]:
        async with AsyncLimiter(redis_cluster_url, prefix=f"{key_prefix}:") as alim:
            return [[(await alim.try_acquire(rule, key, now=EPOCH_US)).allowed for _ in range(3)] for key in keys]

    before = [script_calls(node) for node in redis_cluster.nodes]
    assert asyncio.run(main()) == [[True, True, False]] * 3
    after = [script_calls(node) for node in redis_cluster.nodes]
    # three decisions on each master (and at most one call more where the library was
    # missing), and never a COMMAND GETKEYS round trip before an FCALL
    assert [(3 <= a[0] - b[0] <= 4, a[1] - b[1]) for a, b in zip(after, before, strict=True)] == [(True, 0)] * 3


@pytest.mark.parametrize("algorithm", ["token_bucket", "fixed_window", "sliding_window_log", "gcra"])
def test_a_batch_over_three_masters_refused_by_one_item_charges_none(
    redis_cluster: RedisCluster, limiter: Limiter, algorithm: str
) -> None:
    """The store charges each slot, then refunds the slots that charged when another refused
    (the documented Cluster path): afterwards every other item is whole again."""
    per_user = Rule("per_user", ["5/hour"], algorithm=algorithm)
    per_ip = Rule("per_ip", ["4/hour"], algorithm=algorithm)
    global_ = Rule("global", ["1/hour"], algorithm=algorithm)
    user, ip, everyone = keys_on_each_node(redis_cluster, "batch").values()
    assert limiter.try_acquire(global_, everyone)  # the global limit is now used up
    # (peek with cost 0: what is left, without charging)

    batch = limiter.try_acquire_many([(per_user, user, 2), (per_ip, ip, 3), (global_, everyone)])

    assert not batch
    assert [d.allowed for d in batch] == [True, True, False]  # only the global limit refused
    assert limiter.peek(per_user, user, 0).remaining == 5
    assert limiter.peek(per_ip, ip, 0).remaining == 4
    assert limiter.peek(global_, everyone, 0).remaining == 0


@pytest.mark.parametrize("algorithm", ["token_bucket", "sliding_window_log"])
def test_a_batch_over_three_masters_admitted_charges_every_item(
    redis_cluster: RedisCluster, limiter: Limiter, algorithm: str
) -> None:
    per_user = Rule("per_user", ["5/hour"], algorithm=algorithm)
    per_ip = Rule("per_ip", ["4/hour"], algorithm=algorithm)
    user, ip, _ = keys_on_each_node(redis_cluster, "batch-ok").values()

    assert limiter.try_acquire_many([(per_user, user, 2), (per_ip, ip, 3)])
    assert limiter.peek(per_user, user, 0).remaining == 3
    assert limiter.peek(per_ip, ip, 0).remaining == 1


def test_async_batch_over_several_masters_is_all_or_nothing(
    redis_cluster: RedisCluster, redis_cluster_url: str, key_prefix: str
) -> None:
    small = Rule("small", ["1/hour"], algorithm="token_bucket")
    big = Rule("big", ["10/hour"], algorithm="token_bucket")
    a, b, _ = keys_on_each_node(redis_cluster, "async-batch").values()

    async def main() -> tuple[bool, bool, int, int]:
        async with AsyncLimiter(redis_cluster_url, prefix=f"{key_prefix}:") as alim:
            first = bool(await alim.try_acquire_many([(big, a, 3), (small, b)]))
            second = bool(await alim.try_acquire_many([(big, a, 3), (small, b)]))
            return first, second, (await alim.peek(big, a, 0)).remaining, (await alim.peek(small, b, 0)).remaining

    assert asyncio.run(main()) == (True, False, 7, 0)


# A key that begins with "}" would, unescaped, give an empty hash tag (the whole name is
# then hashed, and each rule of the key lands on a slot of its own).
@pytest.mark.parametrize("key", ["tenant-9", "}tenant", "}", "a}b", "{x}", "x\x00}y", "%7D"])
def test_every_rule_of_one_key_shares_its_slot_and_one_call_decides_them(
    redis_cluster: RedisCluster, limiter: Limiter, key_prefix: str, key: str
) -> None:
    per_minute = Rule("per_minute", ["10/minute"], algorithm="token_bucket")
    per_hour = Rule("per_hour", ["100/hour"], algorithm="sliding_window_log")
    stored = [wire.storage_key(f"{key_prefix}:", rule.plan, key) for rule in (per_minute, per_hour)]
    slots = set()
    for name in stored:
        with redis_cluster.nodes[0].client() as conn:
            slots.add(int(conn.execute_command("CLUSTER", "KEYSLOT", name)))
    assert len(slots) == 1
    owner = redis_cluster.node_for_slot(slots.pop())

    assert limiter.try_acquire_many([(per_minute, key), (per_hour, key)])  # loads the library on the owner
    before = {node.port: script_calls(node) for node in redis_cluster.nodes}
    assert limiter.try_acquire_many([(per_minute, key), (per_hour, key)])
    assert limiter.try_acquire(per_minute, key)
    after = {node.port: script_calls(node) for node in redis_cluster.nodes}

    # two calls, both on the owner, and no COMMAND GETKEYS anywhere (redis-py would ask a
    # node for an FCALL's keys before every call)
    assert {port: (after[port][0] - before[port][0], after[port][1] - before[port][1]) for port in after} == {
        node.port: (2 * int(node.port == owner.port), 0) for node in redis_cluster.nodes
    }
    assert limiter.peek(per_minute, key, 0).remaining == 7
    assert limiter.peek(per_hour, key, 0).remaining == 98


def keys_in_slot(slot: int, count: int, stem: str) -> list[str]:
    """``count`` keys whose hash slot (the store's hash tag is the key itself) is ``slot``."""
    keys: list[str] = []
    i = 0
    while len(keys) < count:
        key = f"{stem}-{i}"
        if key_slot(key.encode()) == slot:
            keys.append(key)
        i += 1
    return keys


def other_node(cluster: RedisCluster, key: str) -> RedisServer:
    owner = cluster.node_for_slot(key_slot(key.encode()))
    return next(node for node in cluster.nodes if node.port != owner.port)


def test_an_exhausted_key_stays_refused_after_its_slot_moves_to_another_master(
    reshard_cluster: RedisCluster, key_prefix: str
) -> None:
    """Resharding moves the key's state with its slot; the limiter (whose slot map is now
    stale) follows the MOVED redirection to the new owner and finds the state there."""
    cluster = reshard_cluster
    rule = Rule("api", ["5/minute"], algorithm="token_bucket")
    stored = wire.storage_key(f"{key_prefix}:", rule.plan, "user-1")
    target = other_node(cluster, "user-1")
    with Limiter(cluster.url, prefix=f"{key_prefix}:") as limiter:
        assert [limiter.try_acquire(rule, "user-1", now=EPOCH_US).allowed for _ in range(6)] == [True] * 5 + [False]
        source = cluster.migrate_slot(key_slot(b"user-1"), target)
        refused = limiter.try_acquire(rule, "user-1", now=EPOCH_US)
        assert not refused
        assert refused.retry_after > 0
    with target.client() as on_target, source.client() as on_source:
        assert on_target.exists(stored) == 1
        assert on_source.execute_command("CLUSTER", "COUNTKEYSINSLOT", key_slot(b"user-1")) == 0


def test_while_a_slot_migrates_moved_keys_and_new_keys_are_decided_on_the_importing_master(
    reshard_cluster: RedisCluster, key_prefix: str
) -> None:
    """Mid-migration the old owner still owns the slot but answers ``-ASK`` for keys it no
    longer holds: an exhausted key that moved stays refused, a new key is charged on the
    importing master, and nothing is written on the old owner."""
    cluster = reshard_cluster
    rule = Rule("api", ["3/minute"], algorithm="sliding_window_log")
    slot = key_slot(b"user-1")
    moved, new = "user-1", keys_in_slot(slot, 2, "other")[0]
    target = other_node(cluster, moved)
    with Limiter(cluster.url, prefix=f"{key_prefix}:") as limiter:
        for _ in range(3):
            assert limiter.try_acquire(rule, moved, now=EPOCH_US)
        source = cluster.begin_slot_migration(slot, target)
        try:
            assert not limiter.try_acquire(rule, moved, now=EPOCH_US)
            assert [limiter.try_acquire(rule, new, now=EPOCH_US).allowed for _ in range(4)] == [True] * 3 + [False]
            with source.client() as on_source:
                assert on_source.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        finally:
            cluster.finish_slot_migration(slot, target)
        with target.client() as on_target:
            assert on_target.exists(wire.storage_key(f"{key_prefix}:", rule.plan, new)) == 1


def test_decisions_stay_exact_while_a_slot_moves_under_load(reshard_cluster: RedisCluster, key_prefix: str) -> None:
    """Four threads hammer four keys of one slot (the clock held still) while the slot
    moves to another master: no caller sees an error and each key admits exactly its
    limit, so no state was lost or doubled on the way."""
    cluster = reshard_cluster
    rule = Rule("api", ["50/minute"], algorithm="sliding_window_log")
    slot = key_slot(b"user-1")
    keys = keys_in_slot(slot, 4, "hot")
    target = other_node(cluster, keys[0])
    work = [key for _ in range(200) for key in keys]  # 200 attempts per key, interleaved
    admitted = dict.fromkeys(keys, 0)
    errors: list[BaseException] = []
    done = 0
    lock = threading.Lock()
    with Limiter(cluster.url, prefix=f"{key_prefix}:") as limiter:

        def hammer() -> None:
            nonlocal done
            while True:
                with lock:
                    if not work or errors:
                        return
                    key = work.pop()
                try:
                    allowed = limiter.try_acquire(rule, key, now=EPOCH_US).allowed
                except BaseException as exc:  # noqa: BLE001 - the test reports whatever escaped
                    with lock:
                        errors.append(exc)
                    return
                with lock:
                    admitted[key] += allowed
                    done += 1

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            deadline = time.monotonic() + 10
            while done < 60 and not errors and time.monotonic() < deadline:
                time.sleep(0.001)
            cluster.migrate_slot(slot, target)
            with lock:
                left_after_move = len(work)
        finally:
            for thread in threads:
                thread.join(30)
    if errors:
        raise AssertionError(f"the limiter raised {errors[0]!r} to its caller") from errors[0]
    assert admitted == dict.fromkeys(keys, 50)
    assert left_after_move > 0  # the slot moved while the load ran
    with target.client() as on_target:
        assert all(on_target.exists(wire.storage_key(f"{key_prefix}:", rule.plan, key)) for key in keys)


def test_async_limiter_follows_ask_then_moved_while_a_slot_moves(
    reshard_cluster: RedisCluster, key_prefix: str
) -> None:
    cluster = reshard_cluster
    rule = Rule("api", ["2/minute"], algorithm="gcra")
    slot = key_slot(b"user-1")
    new = keys_in_slot(slot, 1, "async-other")[0]
    target = other_node(cluster, "user-1")

    async def main() -> list[bool]:
        seen: list[bool] = []
        async with AsyncLimiter(cluster.url, prefix=f"{key_prefix}:") as alim:
            for _ in range(3):
                seen.append((await alim.try_acquire(rule, "user-1", now=EPOCH_US)).allowed)
            await asyncio.to_thread(cluster.begin_slot_migration, slot, target)
            seen.append((await alim.try_acquire(rule, "user-1", now=EPOCH_US)).allowed)  # ASK
            seen.append((await alim.try_acquire(rule, new, now=EPOCH_US)).allowed)  # ASK, a new key
            await asyncio.to_thread(cluster.finish_slot_migration, slot, target)
            seen.append((await alim.try_acquire(rule, "user-1", now=EPOCH_US)).allowed)  # MOVED
            seen.append((await alim.try_acquire(rule, new, now=EPOCH_US)).allowed)
            seen.append((await alim.try_acquire(rule, new, now=EPOCH_US)).allowed)
        return seen

    assert asyncio.run(main()) == [True, True, False, False, True, False, True, False]
    with target.client() as on_target:
        for key in ("user-1", new):
            assert on_target.exists(wire.storage_key(f"{key_prefix}:", rule.plan, key)) == 1
