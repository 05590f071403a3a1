"""States of numbers are stored as tagged struct doubles; a state that an earlier version
stored with cmsgpack (the same fields, no TTL reach) is read as the same state and written
back in the new encoding, so an upgrade neither loses a key's state nor fails on it."""

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
@pytest.mark.parametrize("limits", [["5/minute"], ["5/minute", "20/hour"]], ids=["one", "two"])
def test_a_state_in_the_earlier_msgpack_encoding_is_read_as_the_same_state(
    redis_server: RedisServer, algorithm: str, limits: list[str]
) -> None:
    assert algorithm in ALGORITHMS
    plan = Rule("enc", limits, algorithm=algorithm).plan
    store = RedisStore(redis_server.url, prefix="enc:")
    client: Any = redis_py.Redis.from_url(redis_server.url)
    try:
        now = EPOCH_US
        for _ in range(3):  # some state on both keys, the same on each
            for key in ("new", "old"):
                store.decide(Op.decide(plan, key, 1), now)
            now += 1_000_000
        old_key = storage_key("enc:", plan, "old")
        client.eval(TO_MSGPACK, 1, old_key, *(repr(v) for v in fields(client.get(old_key))))
        assert client.get(old_key)[0] in range(0x90, 0xA0)  # as an earlier version stored it
        for step in range(8):  # the same decisions, to the limit and past it
            new = store.decide(Op.decide(plan, "new", 1), now)
            old = store.decide(Op.decide(plan, "old", 1), now)
            assert old == new, (step, old, new)
            now += 250_000
        assert client.get(old_key)[0] == 1  # written back in the new encoding
        assert fields(client.get(old_key)) == fields(client.get(storage_key("enc:", plan, "new")))
        assert client.pttl(old_key) > 0
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
