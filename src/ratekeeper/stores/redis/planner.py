"""``RedisPlanner``: the Redis store without I/O. What to send for a list of ops, and how to
read the replies.

The planner owns the store's options, its key naming, the wire format (``wire.py``'s
Redis form) and the Lua (``script.py``): ``plan`` turns ops into ``Call``s, ``command``
turns a call into the command to send (``FCALL`` of the library, or ``EVALSHA`` of the
call's script where the server has no Functions), ``read`` turns the replies into
decisions. The shells (``shell_async.py`` and its generated twin ``shell.py``) only send.

On a single node (standalone, Sentinel) the ops of one ``now`` are one call, whatever the
keys; on a Cluster, one call per hash slot, sent in one pipeline. Ops on the same key keep
their order inside their call.
"""

from __future__ import annotations

from binascii import crc_hqx
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import ConfigurationError, StoreError
from ratekeeper.op import Op
from ratekeeper.stores import wire
from ratekeeper.stores.options import bool_option, number_option, prefix_option
from ratekeeper.stores.redis.script import LIBRARY, Script, script_for, script_of
from ratekeeper.stores.redis.url import RedisTarget, parse_redis_url

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan

__all__ = ["Call", "RedisPlanner", "key_slot", "row"]


class Call:
    """One decision call: the positions of its ops in the caller's list, its ops, its keys
    and args (``wire.py``'s Redis form), and the script that runs it by ``EVALSHA``."""

    __slots__ = ("args", "keys", "ops", "positions", "script")

    def __init__(
        self, positions: tuple[int, ...], ops: Sequence[wire.Op], keys: list[str], args: list[Any], script: Script
    ) -> None:
        self.positions = positions
        self.ops = ops
        self.keys = keys
        self.args = args
        self.script = script


_ALONE = (0,)


class RedisPlanner:
    """Options, key naming, call planning and reading for one Redis store."""

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
        self.functions: bool | None = None
        """False once a call found that decisions must go by ``EVALSHA`` of each call's
        script (a server without Functions, or an ACL that forbids them): decided once, then
        remembered. Otherwise they go by ``FCALL`` of ``LIBRARY`` (True once this store
        loaded it; None while it found it loaded)."""

    # -- what to send ---------------------------------------------------------------------

    def plan(self, ops: Sequence[wire.Op], now: int | None, atomic: bool = False) -> list[Call]:
        """The calls deciding ``ops`` (one per hash slot on a Cluster)."""
        if len(ops) == 1:  # every lone decision: atomic or not, the same call
            op = ops[0]
            keys, args = wire.encode_redis_one(op, self.prefix, now)
            return [Call(_ALONE, ops, keys, args, script_of(op[1].algorithm.name))]
        if not self.cluster:
            return [self._call(tuple(range(len(ops))), ops, now, atomic)]
        groups: dict[int, list[int]] = {}
        for i, op in enumerate(ops):
            slot = key_slot(wire.storage_key(self.prefix, op[1], op[2]).encode())
            groups.setdefault(slot, []).append(i)
        return [self._call(tuple(positions), [ops[i] for i in positions], now, atomic) for positions in groups.values()]

    def _call(self, positions: tuple[int, ...], ops: Sequence[wire.Op], now: int | None, atomic: bool) -> Call:
        keys, args = wire.encode_redis(ops, self.prefix, now, atomic)
        return Call(positions, ops, keys, args, script_for({op[1].algorithm.name for op in ops}))

    def command(self, call: Call) -> tuple[Any, ...]:
        """The command that sends ``call``."""
        keys = call.keys
        if self.functions is False:
            return ("EVALSHA", call.script.sha, len(keys), *keys, *call.args)
        return ("FCALL", LIBRARY.function, len(keys), *keys, *call.args)

    @staticmethod
    def library_load() -> tuple[str, ...]:
        """The command that loads (or replaces) the Functions library."""
        return ("FUNCTION", "LOAD", "REPLACE", LIBRARY.source)

    def storage_key(self, plan: Plan, key: str) -> str:
        """The Redis key holding the state of ``key`` under ``plan`` (what a reset deletes)."""
        return wire.storage_key(self.prefix, plan, key)

    # -- what came back -------------------------------------------------------------------

    @staticmethod
    def read(calls: Sequence[Call], replies: Sequence[Any]) -> list[Any]:
        """Each op's decision (for a refund: whether it gave anything back), in the callers'
        order, from the calls' replies. On a Cluster the ops of a call that failed get its
        ``StoreError`` (``replies`` holds it in that call's place), and that error is raised
        when every call failed."""
        if len(calls) == 1:
            return wire.decode(calls[0].ops, replies[0])
        out: list[Any] = [None] * sum(len(call.positions) for call in calls)
        failures = 0
        for call, reply in zip(calls, replies, strict=True):
            if isinstance(reply, StoreError):
                failures += 1
                for position in call.positions:
                    out[position] = reply
                continue
            for position, decision in zip(call.positions, wire.decode(call.ops, reply), strict=True):
                out[position] = decision
        if failures == len(calls):
            raise out[0]
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


def row(op: wire.Op) -> tuple[str, str]:
    """Which stored key ``op`` decides on, for the coalescing of concurrent calls
    (``stores/coalescing.py``: the ops of one key keep their arrival order): its plan's
    table (the rule's name, algorithm and scale, which the storage key's digest stands
    for) and its key."""
    return op[1].table, op[2]


def key_slot(key: bytes) -> int:
    """The Cluster hash slot of ``key``: CRC16 (XMODEM) of its hash tag (the text between its
    first ``{`` and the next ``}``, when not empty), else of the whole key, modulo 16384."""
    start = key.find(b"{")
    if start > -1:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc_hqx(key, 0) % 16384
