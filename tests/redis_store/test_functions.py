"""How the Redis store's Lua reaches the server: a Functions library called by FCALL, loaded
again where it is missing, and EVALSHA of the same Lua where Functions are not to be had.

Each test runs on a private ``redis-server`` (``redis_server``), so that flushing its
functions or changing its users touches nobody else.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ratekeeper import Rule
from ratekeeper.op import Op
from ratekeeper.stores.redis.script import ALGORITHM_FILES, LIBRARY, Library, _read, script_of
from ratekeeper.stores.redis.store import RedisStore
from ratekeeper.stores.redis.store_async import AsyncRedisStore
from servers import RedisCluster, RedisServer

pytestmark = pytest.mark.redis

PLAN = Rule("fn", ["5/minute"], algorithm="gcra").plan
EPOCH_US = 1_763_870_000_000_000


def stats(server: RedisServer, command: str) -> tuple[int, int]:
    """(calls, rejected_calls) of ``command`` on ``server`` (INFO commandstats)."""
    with server.client() as conn:
        found: dict[str, Any] = conn.info("commandstats").get(f"cmdstat_{command}", {})
    return int(found.get("calls", 0)), int(found.get("rejected_calls", 0))


def libraries(server: RedisServer) -> list[str]:
    with server.client() as conn:
        listed = conn.function_list()  # RESP2: each library a flat [name, value, ...] list
    return sorted(dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"].decode() for lib in listed)


def remaining_after(store: RedisStore, calls: int) -> list[int]:
    return [store.decide(Op.decide(PLAN, "k", 1), EPOCH_US).remaining for _ in range(calls)]


def test_the_library_and_the_scripts_are_one_text_named_after_it() -> None:
    """Every Lua file is in the library, and each script holds the same text; the library's
    name (and its one function's) is a digest of that text, so another version of the Lua
    is another library."""
    for name in ("prelude", "main", *ALGORITHM_FILES):
        assert _read(name) in LIBRARY.source, name
    for name in ALGORITHM_FILES:
        assert _read(name) in script_of(name).source
        assert _read("main") in script_of(name).source
    assert LIBRARY.source.startswith(f"#!lua name={LIBRARY.name}\n")
    assert LIBRARY.name == LIBRARY.function and LIBRARY.name.startswith("ratekeeper_")
    assert Library("return 1").name != Library("return 2").name


def test_decisions_are_fcalls_of_the_library_loaded_once(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, prefix="rk:")
    assert remaining_after(store, 3) == [4, 3, 2]
    assert store.planner.functions is True
    assert libraries(redis_server) == [LIBRARY.name]
    assert stats(redis_server, "function|load")[0] == 1
    assert stats(redis_server, "fcall") == (4, 0)  # the first met "Function not found", then three ran
    assert stats(redis_server, "evalsha") == (0, 0)
    store.close()


def test_another_version_of_the_library_on_the_same_server_is_left_alone(redis_server: RedisServer) -> None:
    other = Library("-- an older ratekeeper\nlocal function rk_dispatch(KEYS, ARGV) return {} end")
    with redis_server.client() as conn:
        conn.function_load(other.source)
    store = RedisStore(redis_server.url, prefix="rk:")
    assert remaining_after(store, 2) == [4, 3]
    assert libraries(redis_server) == sorted([other.name, LIBRARY.name])
    store.close()


def test_a_server_that_lost_the_library_gets_it_again_and_the_caller_never_sees_it(
    redis_server: RedisServer,
) -> None:
    """FUNCTION FLUSH (or a restart without persistence, a failover to a node that never
    had it): the next call meets "Function not found", loads the library and decides."""
    store = RedisStore(redis_server.url, prefix="rk:")
    assert remaining_after(store, 1) == [4]
    with redis_server.client() as conn:
        conn.function_flush()
    assert remaining_after(store, 1) == [3]
    assert stats(redis_server, "function|load")[0] == 2
    store.close()

    async def run() -> list[int]:
        astore = AsyncRedisStore(redis_server.url, prefix="rk:")
        with redis_server.client() as conn:
            conn.function_flush()
        out = [(await astore.decide(Op.decide(PLAN, "k", 1), EPOCH_US)).remaining]
        await astore.aclose()
        return out

    assert asyncio.run(run()) == [2]


def _user(server: RedisServer, name: str, *rules: str) -> str:
    """A user with every permission but ``rules`` taken away; its URL."""
    with server.client() as conn:
        conn.acl_setuser(name, enabled=True, nopass=True, keys=["*"], commands=["+@all", *rules])
    return f"redis://{name}:x@127.0.0.1:{server.port}/0"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_user_without_functions_decides_by_evalsha_and_stops_trying_fcall(
    redis_server: RedisServer, mode: str
) -> None:
    """An ACL that forbids FCALL (as Redis 6.2 lacks it): the first call is refused, the
    store goes to EVALSHA of the same Lua and remembers it (no FCALL after the first)."""
    url = _user(redis_server, "nofunctions", "-fcall", "-function")
    if mode == "sync":
        store = RedisStore(url, prefix="rk:")
        assert remaining_after(store, 3) == [4, 3, 2]
        assert store.planner.functions is False
        store.close()
    else:

        async def run() -> tuple[list[int], bool | None]:
            astore = AsyncRedisStore(url, prefix="rk:")
            out = [(await astore.decide(Op.decide(PLAN, "k", 1), EPOCH_US)).remaining for _ in range(3)]
            await astore.aclose()
            return out, astore.planner.functions

        assert asyncio.run(run()) == ([4, 3, 2], False)
    assert stats(redis_server, "fcall") == (0, 1)
    assert stats(redis_server, "evalsha")[0] == 4  # the first met NOSCRIPT
    assert libraries(redis_server) == []


def test_a_user_that_may_call_functions_but_not_load_them_falls_back_when_the_library_is_missing(
    redis_server: RedisServer,
) -> None:
    url = _user(redis_server, "noload", "-function|load")
    store = RedisStore(url, prefix="rk:")
    assert remaining_after(store, 2) == [4, 3]
    assert store.planner.functions is False
    assert stats(redis_server, "fcall")[0] == 1  # "Function not found", then FUNCTION LOAD refused
    assert stats(redis_server, "function|load") == (0, 1)
    store.close()

    with redis_server.client() as conn:  # once someone has loaded it, such a user uses it
        conn.function_load(LIBRARY.source)
    again = RedisStore(url, prefix="rk:")
    assert remaining_after(again, 1) == [2]
    assert again.planner.functions is None  # FCALL, and nothing to load
    again.close()


def test_a_refusal_that_is_not_about_functions_is_an_error_and_changes_nothing(redis_server: RedisServer) -> None:
    """A value the Lua cannot read: the call fails (StoreError), FCALL stays the way."""
    store = RedisStore(redis_server.url, prefix="rk:")
    assert remaining_after(store, 1) == [4]
    with redis_server.client() as conn:
        conn.set(store.planner.storage_key(PLAN, "k"), b"\xc1 not a state")
    with pytest.raises(Exception, match="Redis failed a decision"):
        remaining_after(store, 1)
    assert store.planner.functions is True
    store.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_on_a_cluster_the_first_miss_loads_the_library_on_every_primary(
    redis_cluster: RedisCluster, redis_cluster_url: str, key_prefix: str, mode: str
) -> None:
    """A Cluster whose masters all lost the library: one decision loads it on its key's
    master and on the others, so a later call on any master finds it."""
    for node in redis_cluster.nodes:
        with node.client() as conn:
            conn.function_flush()

    def one_decision() -> int:
        if mode == "sync":
            store = RedisStore(redis_cluster_url, prefix=f"{key_prefix}:")
            remaining = store.decide(Op.decide(PLAN, "user-1", 1), EPOCH_US).remaining
            store.close()
            return remaining

        async def run() -> int:
            astore = AsyncRedisStore(redis_cluster_url, prefix=f"{key_prefix}:")
            remaining = (await astore.decide(Op.decide(PLAN, "user-1", 1), EPOCH_US)).remaining
            await astore.aclose()
            return remaining

        return asyncio.run(run())

    assert one_decision() == 4
    assert [libraries(node) for node in redis_cluster.nodes] == [[LIBRARY.name]] * len(redis_cluster.nodes)
