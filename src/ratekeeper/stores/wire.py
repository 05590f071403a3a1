"""The wire format of the server stores: one call to the store carries a list of operations.

Redis (a Lua script's ``KEYS`` / ``ARGV``) and PostgreSQL (a function's ``text[]``
arguments) decide from the same flat list of strings, so what to send and how to read
the answer is written once, here, with no I/O.

Request (every field a string; Redis ``ARGV``, PostgreSQL ``args text[]``)::

    now        ""  = the store's clock (Redis TIME, PostgreSQL clock_timestamp()), else µs
    atomic     "1" = every DECIDE op of the call is charged or none (try_acquire_many)
               "0" = each op on its own, applied in order (coalesced calls)
    n_ops
    then, per op:
      mode       "d" decide and charge when admitted; "p" peek (decide, write nothing);
                 "r" refund / release; "c" charge without a check (the key may go into
                 debt: ``Algorithm.charge``)
      key        1-based index into the call's keys (Redis KEYS, PostgreSQL keys text[])
      algorithm  the algorithm's name ("gcra", "fixed_window", ...)
      n_limits
      spec       n_limits x the algorithm's spec fields (``Algorithm.spec``), integers
      cost
      max_wait   "" = None (try_acquire), else µs (acquire's reservation window)
      lease      "" = None, else the lease id (concurrency)

Reply: a flat list of integers (Python ints: both clients hand them over as such). Per
"d" / "p" / "c" op, in order::

    allowed (1 / 0), denied_index (-1 when allowed), retry_us (-1 = never), delay_us,
    remaining_1 .. remaining_n, reset_1 .. reset_n

and per "r" op one integer: 1, but 0 for a release of a lease that key did not hold
(expired, released, another key's or another rule's). Ops of
one call that name the same key see each other's effects in order, exactly as if they
ran one after another.

Redis reads the same request in a compact form (``encode(..., compact=True)``), because
every argument of a script call costs the client a RESP frame and the server a Lua string:
each rule once, and ops that name it by number::

    now, atomic, n_ops, n_rules
    then, per rule: algorithm, n_limits, spec (n_limits x the algorithm's spec fields)
    then, per op up to the end: mode, key, rule (1-based index into the rules), and, for
      modes "d", "p", "r" and "c", cost, max_wait, lease as above; mode "D" is "d" with cost 1,
      no max_wait and no lease (the commonest op: three arguments)

The reply is the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.decision import Decision
from ratekeeper.op import DECIDE, PEEK, REFUND, Op

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan

__all__ = [
    "DECIDE",
    "PEEK",
    "REFUND",
    "Op",
    "decode",
    "encode",
    "encode_one",
    "encode_redis",
    "encode_redis_one",
    "escape",
    "op_fields",
    "storage_key",
]


_ESCAPES = str.maketrans({"%": "%25", "}": "%7D", "\x00": "%00"})


def escape(text: str) -> str:
    """``text`` as it goes into a storage key: ``%``, ``}`` and NUL written ``%25``, ``%7D``
    and ``%00`` (every other character as it is, so a plain key reads as itself).

    Injective (``%`` is escaped too), so two different texts never share a storage key;
    free of ``}``, so the caller's key always ends the Redis Cluster hash tag that begins
    before it (a key such as ``"}x"`` would otherwise make the tag empty and scatter its
    rules over slots); free of NUL, which PostgreSQL's ``text`` cannot hold (libpq would
    cut the key there, and ``"bob\x00 1"`` and ``"bob\x00 2"`` would share a row).
    """
    if "%" in text or "}" in text or "\x00" in text:
        return text.translate(_ESCAPES)
    return text


def _plan_part(plan: Plan) -> tuple[list[Any], str]:
    """The algorithm, limit count and spec fields of ``plan``, and the storage key's tail
    after the caller's key, ``}:<rule>:<digest>`` (kept on the plan: computed once,
    forgotten with it)."""
    try:
        return plan.derived["wire"]  # type: ignore[no-any-return]
    except KeyError:
        fields: list[Any] = [plan.algorithm.name, len(plan.specs)]
        for spec in plan.specs:
            fields.extend(spec)
        digest = hashlib.blake2b(plan.table.encode(), digest_size=6).hexdigest()
        part = plan.derived["wire"] = (fields, f"}}:{escape(plan.name)}:{digest}")
        return part


def storage_key(prefix: str, plan: Plan, key: str) -> str:
    """Where the state of ``key`` under ``plan`` lives: ``{prefix}{key}:{rule}:{digest}``,
    the key and the rule's name escaped (``escape``).

    The braces make the caller's key the Redis Cluster hash tag, so every rule's state for
    one key shares a slot, whatever the key's characters; the digest tells apart plans
    whose states read differently (``Plan.table``: the algorithm and its scale). No two
    different (rule, key) pairs share a storage key: the escaped key ends at the first
    ``}``, the digest has a fixed length, and the rule's name is what lies between.
    """
    return f"{prefix}{{{escape(key)}{_plan_part(plan)[1]}"


def op_fields(
    mode: str, plan: Plan, key_index: int, cost: int, max_wait: int | None, lease_id: str | None
) -> list[Any]:
    """The request fields of one op (see the module docstring)."""
    fields, _ = _plan_part(plan)
    return [
        mode,
        key_index,
        *fields,
        cost,
        "" if max_wait is None else max_wait,
        "" if lease_id is None else lease_id,
    ]


def encode(
    ops: Sequence[Op], prefix: str, now: int | None = None, atomic: bool = False, compact: bool = False
) -> tuple[list[str], list[Any]]:
    """(keys, args) for one store call deciding ``ops`` in order: in the full form, or in
    the compact form that Redis reads (each rule once) when ``compact``."""
    keys: list[str] = []
    index: dict[str, int] = {}
    args: list[Any] = ["" if now is None else now, "1" if atomic else "0", len(ops)]
    rules: dict[int, int] = {}  # id(plan) -> its rule number (the plans live through the call)
    body = [] if compact else args  # the compact form's rules come between the head and the ops
    for mode, plan, key, cost, max_wait, lease_id in ops:
        fields, tail = _plan_part(plan)
        skey = f"{prefix}{{{escape(key)}{tail}"
        i = index.get(skey)
        if i is None:
            keys.append(skey)
            i = index[skey] = len(keys)
        if not compact:
            body += op_fields(mode, plan, i, cost, max_wait, lease_id)
            continue
        r = rules.get(id(plan))
        if r is None:
            args += fields
            r = rules[id(plan)] = len(rules) + 1
        body += _redis_op(mode, i, r, cost, max_wait, lease_id)
    if compact:
        args.insert(3, len(rules))
        args += body
    return keys, args


def encode_one(op: Op, prefix: str, now: int | None = None) -> tuple[list[str], list[Any]]:
    """``encode([op], prefix, now)``: the call of one decision."""
    return encode((op,), prefix, now)


def encode_redis(
    ops: Sequence[Op], prefix: str, now: int | None = None, atomic: bool = False
) -> tuple[list[str], list[Any]]:
    """``encode(ops, prefix, now, atomic, compact=True)``: the Redis call deciding ``ops``."""
    return encode(ops, prefix, now, atomic, compact=True)


def encode_redis_one(op: Op, prefix: str, now: int | None = None) -> tuple[list[str], list[Any]]:
    """``encode([op], prefix, now, compact=True)``: the Redis call of one decision."""
    return encode((op,), prefix, now, compact=True)


def _redis_op(
    mode: str, key_index: int, rule: int, cost: int, max_wait: int | None, lease_id: str | None
) -> tuple[Any, ...]:
    """One op's fields in the compact form: "D" for a plain decide of cost 1."""
    if cost == 1 and mode == DECIDE and max_wait is None and lease_id is None:
        return ("D", key_index, rule)
    return (mode, key_index, rule, cost, "" if max_wait is None else max_wait, "" if lease_id is None else lease_id)


def decode(ops: Sequence[Op], reply: Sequence[Any]) -> list[Decision | bool]:
    """The decision of each op from the store's flat reply (for a refund: whether it gave
    anything back)."""
    out: list[Decision | bool] = []
    at = 0
    for mode, plan, _, cost, _, lease_id in ops:
        if mode == REFUND:
            out.append(reply[at] == 1)
            at += 1
            continue
        n = len(plan.specs)
        allowed = reply[at] == 1
        out.append(
            Decision(
                (
                    plan.name,
                    plan.limits,
                    allowed,
                    reply[at + 1],
                    reply[at + 2],
                    reply[at + 3],
                    tuple(reply[at + 4 : at + 4 + n]),
                    tuple(reply[at + 4 + n : at + 4 + 2 * n]),
                    lease_id if allowed and cost and plan.leases else None,
                    None,
                )
            )
        )
        at += 4 + 2 * n
    return out
