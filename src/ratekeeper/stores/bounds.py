"""The bounds every store decides exactly, checked on each op before it joins a batch.

An op that reaches a server store is coalesced with other callers' ops into one Lua call
or one SQL statement; a value that store cannot hold (a cost past PostgreSQL's bigint, a
time past the 2**53 that Lua's doubles hold exactly, a release of a lease without its
id, a lone surrogate that UTF-8 cannot encode) would fail or skew every op of that call.
So each store checks each op here, at its entry, and a bad op fails its own call alone
with ``InvalidRequest``. The limiters refuse the same values at the call with the same
words; the service's ``/v1/store`` reaches the stores without a limiter, so the stores
check again.

The bounds are the ones ``Limit`` keeps (``MAX_COUNT``, ten-year periods): a cost above
the largest count can never be admitted by any limit, so refusing it loses nothing. A
charge without a check (CHARGE) takes a cost within the same bound; how deep the debt it
leaves may go is the algorithms' bound (``Algorithm.charge``: one limit's count).
"""

from __future__ import annotations

from typing import Any

from ratekeeper.algorithms.base import MAX_EXACT, UNBOUNDED_WAIT, Plan
from ratekeeper.errors import InvalidRequest
from ratekeeper.limit import MAX_COUNT
from ratekeeper.op import CHARGE, MODES, REFUND
from ratekeeper.rule import MAX_KEY_LENGTH

__all__ = [
    "MAX_COST",
    "MAX_LEASE_ID_LENGTH",
    "MAX_NOW",
    "MAX_WAIT",
    "check_lease_id",
    "check_op",
    "op_problem",
    "unencodable_at",
]

MAX_COST = MAX_COUNT
"""The largest cost (and refund): the largest count a limit may have (2**50)."""
MAX_WAIT = UNBOUNDED_WAIT
"""The largest ``max_wait`` (µs): "as long as it takes", what ``acquire`` sends without a timeout."""
MAX_NOW = MAX_EXACT - 1
"""The furthest explicit ``now`` (µs) from 0, either way (tests step clocks back past 0):
Lua numbers are exact below 2**53."""
MAX_LEASE_ID_LENGTH = 128


def unencodable_at(text: str) -> int | None:
    """The index of the first character of ``text`` that UTF-8 cannot encode (a lone
    surrogate, which ``json.loads`` and ``os.fsdecode`` can return), else None.

    Every store accepts the same keys: any valid Unicode text (NUL, braces, ``%`` and the
    rest are stored faithfully, ``stores.wire.escape``); only these are refused, before
    the op can reach a store or share a batch with other callers' ops.
    """
    if text.isascii():
        return None
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def lease_id_problem(lease_id: object) -> str | None:
    """What is wrong with ``lease_id`` as the id of a lease (None: nothing)."""
    if type(lease_id) is not str:
        return (
            f"lease_id must be the str of a Decision's lease_id (or Lease.id), got {type(lease_id).__name__} "
            f"{lease_id!r}"
        )
    if not lease_id or len(lease_id) > MAX_LEASE_ID_LENGTH or "\x00" in lease_id:
        return (
            f"lease_id {lease_id!r:.200} cannot be a lease id: one is a non-empty str of at most "
            f"{MAX_LEASE_ID_LENGTH} characters without NUL, as a Decision's lease_id (or Lease.id) gives it"
        )
    bad = unencodable_at(lease_id)
    if bad is not None:
        return f"lease_id {lease_id!r} holds a lone surrogate at index {bad}: it cannot be a lease id"
    return None


def check_lease_id(lease_id: object) -> None:
    """Refuse a lease id no store could have issued, the same on every store: not a str,
    empty, longer than ``MAX_LEASE_ID_LENGTH``, or holding NUL or a lone surrogate (which
    PostgreSQL's text and UTF-8 cannot hold). An id of the right form that is not held
    (released, expired, never issued, another key's) releases nothing."""
    problem = lease_id_problem(lease_id)
    if problem is not None:
        raise InvalidRequest(problem)


def _is_int(value: object) -> bool:
    return type(value) is int


def op_problem(op: Any, now: Any = None) -> str | None:
    """What is wrong with ``op`` (and ``now``) for a store, in words that say what would be
    right; None when every store decides it exactly."""
    if not isinstance(op, tuple) or len(op) != 6:
        return f"an op is (mode, plan, key, cost, max_wait, lease_id), got {op!r:.200}"
    mode, plan, key, cost, max_wait, lease_id = op
    if mode not in MODES:
        return f"an op's mode is one of {list(MODES)}, got {mode!r:.40}"
    if not isinstance(plan, Plan):
        return f"an op's plan is a rule's Plan, got {type(plan).__name__}"
    if type(key) is not str or not key or len(key) > MAX_KEY_LENGTH:
        return f"a key is a str of 1 to {MAX_KEY_LENGTH} characters, got {type(key).__name__} {key!r:.80}"
    bad = unencodable_at(key)
    if bad is not None:
        return (
            f"key {key!r:.80} holds a lone surrogate (U+{ord(key[bad]):04X} at index {bad}), which no store "
            "can encode: a key must be valid Unicode text"
        )
    if not _is_int(cost) or not 0 <= cost <= MAX_COST:
        return (
            f"a cost is an integer from 0 to 2**50 ({MAX_COST}, the largest count a limit may have), got {cost!r:.60}"
        )
    if max_wait is not None and (not _is_int(max_wait) or not 0 <= max_wait <= MAX_WAIT):
        return f"max_wait is None or µs from 0 to 2**62 ({MAX_WAIT}: as long as it takes), got {max_wait!r:.60}"
    if lease_id is not None:
        problem = lease_id_problem(lease_id)
        if problem is not None:
            return problem
    elif mode == REFUND and plan.leases:
        return f"rule {plan.name!r} holds leases: a release names the lease_id its decision gave"
    if mode == CHARGE:
        if plan.leases:
            return (
                f"rule {plan.name!r} limits concurrency: a charge without a check holds no lease, so it means "
                "nothing there; take a lease (try_acquire, acquire or lease) instead"
            )
        if max_wait is not None or lease_id is not None:
            return "a charge without a check has no max_wait and no lease_id"
    if now is not None and (not _is_int(now) or not -MAX_NOW <= now <= MAX_NOW):
        return f"now is None (the store's clock) or µs within ±(2**53 - 1) ({MAX_NOW}), got {now!r:.60}"
    return None


def check_op(op: Any, now: Any = None) -> None:
    """Refuse an op (or ``now``) that some store cannot decide exactly: ``InvalidRequest``
    for this op alone, before it joins a batch."""
    problem = op_problem(op, now)
    if problem is not None:
        raise InvalidRequest(problem)
