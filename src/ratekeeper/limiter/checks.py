"""What ``Limiter`` and ``AsyncLimiter`` share: argument checks, the choice of plan, and the
``Op`` each call becomes."""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ratekeeper.decision import BatchDecision, Decision
from ratekeeper.errors import ConfigurationError, InvalidRequest
from ratekeeper.op import Op
from ratekeeper.quota import UNLIMITED
from ratekeeper.rule import MAX_KEY_LENGTH, Rule
from ratekeeper.stores.bounds import MAX_COST, MAX_LEASE_ID_LENGTH, check_lease_id, unencodable_at

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan

__all__ = [
    "MAX_COST",
    "MAX_LEASE_ID_LENGTH",
    "bad_call",
    "batch_ops",
    "batch_result",
    "check",
    "check_lease_id",
    "check_timeout",
    "checked_plan",
    "new_lease_id",
    "refund_op",
    "require_leases",
    "resolve_items",
    "unencodable_at",
]

LEASE_ID_BYTES = 16


def new_lease_id() -> str:
    """A lease id no one can guess: 128 random bits, 22 URL-safe characters (within
    ``MAX_LEASE_ID_LENGTH`` and free of the commas and ``%`` the PostgreSQL wire escapes).

    An id that followed a counter would let any client that saw one of its own ids name
    (and release) the leases handed out around it; the ids also stay unique across
    processes and restarts without any shared state.
    """
    return secrets.token_urlsafe(LEASE_ID_BYTES)


def bad_call(rule: object, key: object, cost: object) -> InvalidRequest:
    """The error for a call whose arguments failed the fast checks: says which and why."""
    if not isinstance(rule, Rule):
        return InvalidRequest(f"expected a Rule, got {type(rule).__name__} {rule!r}")
    if not isinstance(key, str):
        return InvalidRequest(f"key must be a str, got {type(key).__name__} {key!r}")
    if type(key) is not str:
        return InvalidRequest(f"key must be a plain str, got {type(key).__name__} {key!r}; pass str(key)")
    if not key:
        return InvalidRequest("key must not be empty; use a constant such as '*' for a global limit")
    if len(key) > MAX_KEY_LENGTH:
        return InvalidRequest(
            f"key is {len(key)} characters long; the maximum is {MAX_KEY_LENGTH} (hash longer identifiers first)"
        )
    bad = unencodable_at(key)
    if bad is not None:
        return InvalidRequest(
            f"key {key!r} holds a lone surrogate (U+{ord(key[bad]):04X} at index {bad}), which no store can "
            "encode: a key must be valid Unicode text (decode bytes with errors='replace', or hash them)"
        )
    if isinstance(cost, bool) or not isinstance(cost, int):
        return InvalidRequest(f"cost must be a non-negative integer, got {type(cost).__name__} {cost!r}")
    if cost > MAX_COST:
        return InvalidRequest(
            f"cost may be at most 2**50 ({MAX_COST}), the largest count a limit may have (no limit could "
            f"ever admit more), got {cost}"
        )
    return InvalidRequest(f"cost must be a non-negative integer, got {cost!r}")


def checked_plan(rule: Rule, key: str, cost: int) -> Plan | None:
    """The plan that decides ``key`` under ``rule`` (None: the key is not limited), once
    ``rule``, ``key`` and ``cost`` are found acceptable (else ``InvalidRequest``: ``bad_call``).

    Every call of the limiter starts here, ``try_acquire`` included, so the conditions
    are ordered cheapest first and a rule is recognised by its ``quota`` attribute (one
    read; ``isinstance`` would cost more on every call).
    """
    if (
        type(key) is not str
        or not key
        or len(key) > MAX_KEY_LENGTH
        or type(cost) is not int
        or not 0 <= cost <= MAX_COST
        or (not key.isascii() and unencodable_at(key) is not None)
    ):
        raise bad_call(rule, key, cost)
    try:
        quota = rule.quota
    except AttributeError:
        raise bad_call(rule, key, cost) from None
    if quota is None:
        return rule._plan  # the attribute: the ``plan`` property costs a frame
    plan = quota.plan_for(key, rule)
    return None if plan is UNLIMITED else plan


def check(rule: Any, key: Any, cost: Any) -> None:
    """Refuse a call whose rule, key or cost is not acceptable (``InvalidRequest``)."""
    checked_plan(rule, key, cost)


def check_timeout(timeout: float | None) -> float | None:
    """The timeout to use: None (or ``inf``) waits as long as it takes; NaN and negatives are refused."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise InvalidRequest(f"timeout must be None (wait as long as it takes) or seconds >= 0, got {timeout!r}")
    return None if math.isinf(timeout) else timeout


Resolved = list[tuple[Rule, "Op | None"]]
"""The items of a ``try_acquire_many``: each rule with its op (None: not limited)."""


def resolve_items(items: Iterable[Any]) -> Resolved:
    """Check the items of ``try_acquire_many``: ``(rule, key)`` or ``(rule, key, cost)``.

    Each becomes ``(rule, op)``; ``op`` is None for a key that no limit applies to.
    """
    resolved: Resolved = []
    for item in items:
        if not isinstance(item, tuple) or len(item) not in (2, 3):
            raise InvalidRequest(f"each item must be (rule, key) or (rule, key, cost), got {item!r}")
        rule, key, cost = item if len(item) == 3 else (*item, 1)
        plan = checked_plan(rule, key, cost)
        if plan is None:
            resolved.append((rule, None))
        else:
            resolved.append((rule, Op.decide(plan, key, cost, None, new_lease_id() if plan.leases else None)))
    if not resolved:
        raise InvalidRequest("try_acquire_many needs at least one (rule, key) item")
    return resolved


def batch_ops(resolved: Resolved) -> list[Op]:
    """What the store must decide for a batch: the ops of the items whose keys are limited."""
    return [op for _, op in resolved if op is not None]


def batch_result(resolved: Resolved, answers: Iterable[Decision]) -> BatchDecision:
    """The store's answers in the caller's order, with unlimited items filled in."""
    it = iter(answers)
    decisions = tuple(next(it) if op is not None else Decision.unlimited_for(rule.name) for rule, op in resolved)
    if not all(d.allowed for d in decisions):
        # Nothing was charged, so no lease is held: do not hand out their ids.
        decisions = tuple(d.without_lease() if d.lease_id else d for d in decisions)
    return BatchDecision(decisions)


def refund_op(rule: Rule, key: str, cost: int, lease_id: str | None) -> Op | None:
    """Check a refund and make its op (None: the key is not limited, nothing to give back)."""
    plan = checked_plan(rule, key, cost)
    if lease_id is not None:
        check_lease_id(lease_id)
    if plan is None:
        return None
    if plan.algorithm.uses_leases and lease_id is None:
        raise InvalidRequest(f"rule {rule.name!r} holds leases: release one with release(rule, key, lease_id)")
    return Op.refund(plan, key, cost, lease_id)


def charge_op(rule: Rule, key: str, cost: int) -> Op | None:
    """Check a charge without a check and make its op (None: the key is not limited)."""
    plan = checked_plan(rule, key, cost)
    if plan is None:
        return None
    if plan.leases:
        raise InvalidRequest(
            f"rule {rule.name!r} limits concurrency: a charge without a check holds no lease, so it means "
            "nothing there; take a lease (try_acquire, acquire or lease) instead"
        )
    return Op.charge(plan, key, cost)


def require_leases(rule: Rule) -> None:
    if not rule.algo.uses_leases:
        raise ConfigurationError(f"rule {rule.name!r} uses {rule.algorithm}; leases need algorithm='concurrency'")
