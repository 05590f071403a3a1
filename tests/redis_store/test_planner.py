"""``RedisPlanner`` without a server: the calls it plans, the commands they become, and how
it reads their replies."""

from __future__ import annotations

import pytest
from redis.crc import key_slot as redis_py_key_slot

from ratekeeper import Rule
from ratekeeper.errors import StoreError
from ratekeeper.op import Op
from ratekeeper.stores import wire
from ratekeeper.stores.redis.planner import RedisPlanner, key_slot
from ratekeeper.stores.redis.script import LIBRARY, script_of

PLAN = Rule("planner", ["5/minute"], algorithm="gcra").plan
NOW = 1_763_870_000_000_000


def test_a_lone_op_is_one_fcall_of_the_library_and_one_evalsha_of_its_script_without_functions() -> None:
    planner = RedisPlanner("redis://127.0.0.1:6379/0", prefix="p:")
    op = Op.decide(PLAN, "k", 1)
    (call,) = planner.plan([op], NOW)
    keys, args = wire.encode_redis_one(op, "p:", NOW)
    assert (call.keys, call.args, call.positions) == (keys, args, (0,))
    assert planner.command(call) == ("FCALL", LIBRARY.function, 1, *keys, *args)
    planner.functions = False
    assert planner.command(call) == ("EVALSHA", script_of("gcra").sha, 1, *keys, *args)


def test_ops_on_one_node_are_one_call_and_on_a_cluster_one_call_per_slot() -> None:
    ops = [Op.decide(PLAN, f"user-{i}", 1) for i in range(20)]
    (single,) = RedisPlanner("redis://127.0.0.1:6379/0").plan(ops, NOW, atomic=True)
    assert single.positions == tuple(range(20))
    assert single.args[1] == "1"  # atomic
    cluster = RedisPlanner("redis+cluster://127.0.0.1:7000")
    calls = cluster.plan(ops, NOW)
    assert len(calls) > 1
    assert sorted(p for call in calls for p in call.positions) == list(range(20))
    for call in calls:
        assert len({key_slot(key.encode()) for key in call.keys}) == 1


@pytest.mark.parametrize("key", [b"plain", b"p:{user}:rule", b"p:{}x", b"{a}{b}", b"p:{", b"", "p:{é}".encode()])
def test_the_hash_slot_is_redis_clusters(key: bytes) -> None:
    assert key_slot(key) == redis_py_key_slot(key)


def test_replies_are_read_in_the_callers_order_and_a_failed_slot_fails_only_its_ops() -> None:
    cluster = RedisPlanner("redis+cluster://127.0.0.1:7000")
    ops = [Op.decide(PLAN, f"user-{i}", 1) for i in range(20)]
    calls = cluster.plan(ops, NOW)
    error = StoreError("that slot failed")
    allowed = [1, 0, 0, 0, 4, 0]  # allowed, denied index, retry, delay, remaining, reset
    replies = [error] + [allowed * len(call.positions) for call in calls[1:]]
    decisions = RedisPlanner.read(calls, replies)
    for position in calls[0].positions:
        assert decisions[position] is error
    others = [decisions[p] for call in calls[1:] for p in call.positions]
    assert others and all(d.allowed for d in others)
    with pytest.raises(StoreError, match="that slot failed"):
        RedisPlanner.read(calls, [error] * len(calls))  # every call failed: raised
