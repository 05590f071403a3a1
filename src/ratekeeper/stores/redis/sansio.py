"""The Redis store without I/O: what to send for a list of ops, and how to read the replies.

The sync (``redis.py``) and asyncio (``redis_async.py``) shells only execute what this
module plans, so the logic exists once:

- ``Calls``: the script calls for a list of ops that share one ``now``. On a single node
  (standalone, Sentinel) that is one call, whatever the keys; on a Cluster, one call per
  hash slot, sent in one pipeline. Ops on the same key keep their order inside their call.
- ``row``: which stored key an op decides on, for the coalescing of concurrent calls
  (``stores/coalescing.py``: the ops of one key keep their arrival order).
- ``store_down``: whether a failed call says Redis is down or timed out (the calls queued
  behind it then get its error at once).
- ``translate``: redis-py's exceptions become ours (``StoreTimeout``, ``StoreError``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import ConfigurationError, StoreError, StoreTimeout
from ratekeeper.op import Op
from ratekeeper.stores import wire
from ratekeeper.stores.options import bool_option, number_option, prefix_option
from ratekeeper.stores.redis.script import Script, script_for, script_of
from ratekeeper.stores.redis.url import RedisTarget, parse_redis_url

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan

__all__ = [
    "NOT_APPLIED",
    "Call",
    "RedisCore",
    "applied_nothing",
    "function_missing",
    "no_functions",
    "not_run",
    "reclaim_connections",
    "row",
    "store_down",
    "store_errors",
    "translate",
]


@dataclass(frozen=True, slots=True)
class Call:
    """One decision call (``FCALL``, or ``EVALSHA`` of ``script``): the positions of its ops
    in the caller's list, its keys and args."""

    positions: tuple[int, ...]
    ops: Sequence[wire.Op]
    keys: list[str]
    args: list[Any]
    script: Script


class RedisCore:
    """Options, key naming, call planning and decoding for one Redis store."""

    def __init__(self, url: str, **options: Any) -> None:
        target = parse_redis_url(url, **options)
        opts = target.options
        self.target: RedisTarget = target
        self.prefix: str = prefix_option(opts.get("prefix", "ratekeeper:"))
        if "{" in self.prefix or "}" in self.prefix:
            raise ConfigurationError(
                f"prefix {self.prefix!r} must not contain braces: the key's own hash tag follows it"
            )
        self.timeout: float = number_option("timeout", opts.get("timeout", 0.5), float, 0.001)
        self.batching: bool = bool_option("batching", opts.get("batching", True))
        self.max_in_flight: int = number_option("max_in_flight", opts.get("max_in_flight", 2), int, 1)
        self.max_batch: int = number_option("max_batch", opts.get("max_batch", 256), int, 1)
        self.max_connections: int = number_option("max_connections", opts.get("max_connections", 64), int, 1)
        self.cluster = target.kind == "cluster"

    # -- planning -------------------------------------------------------------------------

    def calls(self, ops: Sequence[wire.Op], now: int | None, atomic: bool = False) -> list[Call]:
        """The script calls deciding ``ops`` (one per hash slot on a Cluster)."""
        if len(ops) == 1:
            keys, args = wire.encode_redis_one(ops[0], self.prefix, now)  # atomic or not: the same for one op
            return [Call((0,), ops, keys, args, script_of(ops[0][1].algorithm.name))]
        if not self.cluster:
            keys, args = wire.encode_redis(ops, self.prefix, now, atomic)
            return [Call(tuple(range(len(ops))), ops, keys, args, script_for({op[1].algorithm.name for op in ops}))]
        from redis.crc import key_slot

        groups: dict[int, list[int]] = {}
        for i, op in enumerate(ops):
            slot = key_slot(wire.storage_key(self.prefix, op[1], op[2]).encode())
            groups.setdefault(slot, []).append(i)
        calls = []
        for positions in groups.values():
            part = [ops[i] for i in positions]
            keys, args = wire.encode_redis(part, self.prefix, now, atomic)
            calls.append(Call(tuple(positions), part, keys, args, script_for({op[1].algorithm.name for op in part})))
        return calls

    @staticmethod
    def assemble(count: int, calls: Sequence[Call], replies: Sequence[Any]) -> list[Any]:
        """Each op's decision (None for a refund), in the callers' order, from the calls'
        replies; on a Cluster, the ops of a call that failed get its ``StoreError`` instead."""
        if count == 1:
            return wire.decode(calls[0].ops, replies[0])  # type: ignore[return-value, unused-ignore]
        out: list[Any] = [None] * count
        for call, reply in zip(calls, replies, strict=True):
            if isinstance(reply, StoreError):
                for position in call.positions:
                    out[position] = reply
                continue
            for position, decision in zip(call.positions, wire.decode(call.ops, reply), strict=True):
                out[position] = decision
        return out

    @staticmethod
    def rollback(calls: Sequence[Call], decisions: Sequence[Any]) -> list[wire.Op]:
        """A Cluster batch over several slots was refused somewhere (or a slot's call
        failed): the refunds that undo the calls that charged (each slot's call is
        all-or-nothing on its own; a call that failed is not refunded: whether it ran is
        unknown, and a refund of what was never charged would admit too much)."""
        undo: list[wire.Op] = []
        for call in calls:
            if all(not isinstance(decisions[i], BaseException) and decisions[i] for i in call.positions):
                undo += [Op.refund(plan, key, cost, lease) for _, plan, key, cost, _, lease in call.ops]
        return undo

    def storage_key(self, plan: Plan, key: str) -> str:
        return wire.storage_key(self.prefix, plan, key)


def row(op: wire.Op) -> tuple[str, str]:
    """Which stored key ``op`` decides on: its plan's table (the rule's name, algorithm and
    scale, which the storage key's digest stands for) and its key."""
    return op[1].table, op[2]


def function_missing(exc: BaseException) -> bool:
    """Whether a refused ``FCALL`` says the server lacks the library (a restart without
    persistence, a failover to a node that never had it, a new Cluster node)."""
    return str(exc).startswith("Function not found")


def no_functions(exc: BaseException) -> bool:
    """Whether a refused ``FCALL`` or ``FUNCTION LOAD`` says this server (Redis < 7) or
    this user (an ACL) has no Functions: decisions then go by ``EVALSHA``."""
    import redis.exceptions as rexc

    text = str(exc).lower()
    if isinstance(exc, rexc.NoPermissionError):
        return "'fcall'" in text or "'function" in text
    return "unknown command" in text and ("fcall" in text or "function" in text)


def not_run(exc: BaseException) -> bool:
    """Whether a call refused with ``exc`` did not run, for want of its script or library
    (or of Functions altogether): sending it again cannot charge twice."""
    import redis.exceptions as rexc

    return isinstance(exc, rexc.NoScriptError) or function_missing(exc) or no_functions(exc)


def translate(exc: BaseException, what: str) -> StoreError:
    """Our exception for a redis-py one (the caller chains it with ``from exc``)."""
    import redis.exceptions as rexc

    if _pool_exhausted(exc):
        return StoreTimeout(
            f"no connection to Redis was free for {what}: all max_connections are busy ({exc}); "
            "raise the store option max_connections, or lower the load"
        )
    if isinstance(exc, rexc.TimeoutError | TimeoutError):
        return StoreTimeout(f"Redis did not answer {what} in time: {exc}")
    if isinstance(exc, rexc.ConnectionError | OSError):
        return StoreError(f"Redis is unreachable for {what}: {exc}")
    return StoreError(f"Redis failed {what}: {exc}")


def _pool_exhausted(exc: BaseException) -> bool:
    """redis-py's pools out of connections: ``MaxConnectionsError``, or a blocking pool's
    "No connection available." after waiting its timeout (a plain ``ConnectionError``)."""
    import redis.exceptions as rexc

    return isinstance(exc, rexc.MaxConnectionsError) or (
        type(exc) is rexc.ConnectionError and str(exc).startswith("No connection available")
    )


def store_down(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis timed out or is unreachable (not that one call was wrong,
    nor that this process ran out of connections): the calls queued behind the failed one
    get the same error instead of waiting their turn."""
    import redis.exceptions as rexc

    cause = exc.__cause__
    return (
        isinstance(exc, StoreError)
        and isinstance(cause, rexc.ConnectionError | rexc.TimeoutError | OSError)
        and not _pool_exhausted(cause)
    )


NOT_APPLIED = "ratekeeper: nothing applied: "
"""How ``main.lua`` starts the error of a call that failed before its first write."""


def applied_nothing(exc: BaseException) -> bool:
    """Whether a failed call (``exc``, translated, redis-py's error chained) wrote nothing:
    the script failed before its writes (on one op's data: a key holding a value that is
    not its rule's state), so its ops may be decided again apart."""
    cause = exc.__cause__
    return isinstance(exc, StoreError) and cause is not None and str(cause).startswith(NOT_APPLIED)


def store_errors() -> tuple[type[BaseException], ...]:
    """What redis-py raises for a failed call: its ``RedisError`` tree, the Cluster client's
    ``RedisClusterException`` tree (not a ``RedisError``), and ``OSError``."""
    import redis.exceptions as rexc

    return (rexc.RedisError, rexc.RedisClusterException, OSError)


def reclaim_connections(client: Any) -> None:
    """Give each node of a redis-py asyncio Cluster client back the connections it lost.

    Call it only when no call of ``client`` is under way (after a failure, and before
    closing it): then a connection of a node that is neither free nor connected was lost
    (redis-py 7.4's ``ClusterNode.execute_command`` and ``execute_pipeline`` do not
    release a connection whose connect or send raised). Other
    clients (standalone, Sentinel, the sync Cluster) have no such nodes: nothing happens.
    """
    get_nodes = getattr(client, "get_nodes", None)
    if get_nodes is None:
        return
    for node in get_nodes():
        connections, free = getattr(node, "_connections", None), getattr(node, "_free", None)
        if connections is None or free is None:
            continue
        free_ids = {id(c) for c in free}
        # not free and not connected: lost by a failed connect (a connected one may still
        # be finishing a read for a pipeline that already failed: it returns on its own)
        kept = [c for c in connections if id(c) in free_ids or getattr(c, "is_connected", True)]
        kept_ids = {id(c) for c in kept}
        # and a free one it no longer lists (it came back after an earlier reclaim) is
        # listed again, so that closing the client closes it
        connections[:] = kept + [c for c in free if id(c) not in kept_ids]
