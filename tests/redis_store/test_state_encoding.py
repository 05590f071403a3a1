"""States of numbers are stored as tagged struct doubles (their fields, then the TTL's
reach); any other value at a rule's key is no state of it, and fails its own call."""

from __future__ import annotations

import struct
from typing import Any

import pytest
import redis as redis_py

from ratekeeper import Rule
from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.errors import StoreError
from ratekeeper.op import Op
from ratekeeper.stores.redis.store import RedisStore
from ratekeeper.stores.wire import storage_key
from servers import RedisServer

pytestmark = pytest.mark.redis

EPOCH_US = 1_763_870_000_000_000
NUMBER_STATES = ["gcra", "token_bucket", "fixed_window", "sliding_window_counter", "leaky_bucket"]
TO_MSGPACK = (
    "local t = {} for i = 1, #ARGV do t[i] = tonumber(ARGV[i]) end return redis.call('SET', KEYS[1], cmsgpack.pack(t))"
)


def fields(raw: bytes) -> list[float]:
    """The doubles of a stored state (after its tag byte), without the last one (the TTL's reach)."""
    assert raw[0] == 1, raw[:1]
    values = struct.unpack(f"<{(len(raw) - 1) // 8}d", raw[1:])
    return list(values[:-1])


@pytest.mark.parametrize("algorithm", NUMBER_STATES)
def test_a_state_is_tagged_doubles_and_the_same_numbers_in_another_encoding_are_no_state(
    redis_server: RedisServer, algorithm: str
) -> None:
    assert algorithm in ALGORITHMS
    plan = Rule("enc", ["5/minute", "20/hour"], algorithm=algorithm).plan
    store = RedisStore(redis_server.url, prefix="enc:")
    client: Any = redis_py.Redis.from_url(redis_server.url)
    try:
        now = EPOCH_US
        for key in ("tagged", "packed"):
            assert store.decide(Op.decide(plan, key, 1), now).allowed
        packed = storage_key("enc:", plan, "packed")
        client.eval(TO_MSGPACK, 1, packed, *(repr(v) for v in fields(client.get(packed))))
        assert client.get(packed)[0] in range(0x90, 0xA0)  # a msgpack array of the same numbers
        with pytest.raises(StoreError, match="not a state of this rule"):
            store.decide(Op.decide(plan, "packed", 1), now)
        assert store.decide(Op.decide(plan, "tagged", 1), now).allowed
    finally:
        client.close()
        store.close()


def test_a_value_that_is_no_state_of_the_rule_fails_its_own_call(redis_server: RedisServer) -> None:
    plan = Rule("enc", ["5/minute"], algorithm="gcra").plan
    store = RedisStore(redis_server.url, prefix="enc:")
    client: Any = redis_py.Redis.from_url(redis_server.url)
    try:
        client.set(storage_key("enc:", plan, "bad"), b"not a state")
        with pytest.raises(StoreError, match="not a state of this rule"):
            store.decide(Op.decide(plan, "bad", 1), EPOCH_US)
        assert store.decide(Op.decide(plan, "good", 1), EPOCH_US).allowed
    finally:
        client.close()
        store.close()
