"""What the service store sends to ``POST /v1/store`` and how it reads the reply, without
I/O: the client's end of the wire that ``protocol.py`` describes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.decision import Decision
from ratekeeper.errors import StoreError, StoreTimeout
from ratekeeper.stores.service.options import TOKEN_ENV

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.op import Op

__all__ = ["ServicePlanner"]


class ServicePlanner:
    """The body of one call deciding a list of ops in order (``plan``), and each op's result
    from the reply (``read``). The rule travels with each call, so the service needs no
    rules file to decide for a client."""

    @staticmethod
    def plan(ops: Sequence[Op], now: int | None, atomic: bool = False) -> bytes:
        """The body of one call deciding ``ops`` in order."""
        rules: list[Any] = []
        index: dict[int, int] = {}
        wire_ops: list[Any] = []
        for mode, plan, key, cost, max_wait, lease_id in ops:
            i = index.get(id(plan))  # within one call only: the plans outlive it
            if i is None:
                i = index[id(plan)] = len(rules)
                rules.append(_rule_spec(plan))
            wire_ops.append([mode, i, key, cost, max_wait, lease_id])
        call = {"now": now, "atomic": atomic, "rules": rules, "ops": wire_ops}
        return json.dumps(call, separators=(",", ":")).encode()

    @staticmethod
    def read(ops: Sequence[Op], status: int, body: bytes) -> list[Decision | StoreError | bool | None]:
        """Each op's result from a reply: its decision, whether a refund gave anything back,
        None for a reset, a ``StoreError`` for an op the service's store failed. A reply
        other than 200 raises ``StoreError`` with the service's reason."""
        return _decode(ops, _results(status, body))


def _rule_spec(plan: Plan) -> list[Any]:
    """What the service needs to rebuild ``plan`` (kept on the plan: built once)."""
    try:
        return plan.derived["service"]  # type: ignore[no-any-return]
    except KeyError:
        spec = [plan.name, plan.algorithm.name, [[x.count, x.period_us, x.burst] for x in plan.limits]]
        plan.derived["service"] = spec
        return spec


def _results(status: int, body: bytes) -> list[Any]:
    """The results of a 200 reply; ``StoreError`` (with the service's reason) otherwise."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if status == 200 and isinstance(doc, dict) and isinstance(doc.get("results"), list):
        results: list[Any] = doc["results"]
        return results
    detail = doc.get("detail") if isinstance(doc, dict) else None
    reason = detail or body[:200].decode("utf-8", "replace") or "no body"
    if status == 504:
        raise StoreTimeout(f"the ratekeeper service's store timed out: {reason}")
    if status == 401:
        raise StoreError(
            f"the ratekeeper service answered 401: {reason}; give the store URL a token_file=/path (or set "
            f"{TOKEN_ENV}) holding a secret of the service's admin tokens"
        )
    raise StoreError(f"the ratekeeper service answered {status}: {reason}")


def _decode(ops: Sequence[Op], results: Sequence[Any]) -> list[Decision | StoreError | bool | None]:
    """Each op's decision (None for a refund or reset; a ``StoreError`` for an op the
    service's store failed)."""
    if len(results) != len(ops):
        raise StoreError(f"the ratekeeper service answered {len(results)} results for {len(ops)} ops")
    out: list[Decision | StoreError | bool | None] = []
    for op, result in zip(ops, results, strict=True):
        if result is None or isinstance(result, bool):  # a refund: whether it gave anything back
            out.append(result)
        elif isinstance(result, dict):
            kind = StoreTimeout if result.get("timeout") else StoreError
            out.append(kind(f"the ratekeeper service's store failed: {result.get('error')}"))
        else:
            plan = op[1]
            allowed, denied, retry, delay, remaining, reset, lease = result
            out.append(
                Decision(
                    (plan.name, plan.limits, allowed, denied, retry, delay, tuple(remaining), tuple(reset), lease, None)
                )
            )
    return out
