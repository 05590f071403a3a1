"""``POST /v1/store``: the service as a store for other processes' limiters.

``Limiter("http://host:8080")`` sends its ops here (the wire: ``ratekeeper.stores.
service.sansio``); they are decided in order on the service's own store, as the client's
coalesced calls would be on Redis. The client's limiter applies its own failure policy
and breaker: this route answers what the store did, including its failures per op.

The service decides on its store's clock. A call may carry an explicit ``now`` only when
the service was started with ``RATEKEEPER_EXPLICIT_NOW=1`` (the conformance suite's
traces): otherwise one client could move a key's state in time for every other.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import InvalidRequest, RateKeeperError, StoreError, StoreTimeout
from ratekeeper.op import REFUND
from ratekeeper.server.problems import BadInput
from ratekeeper.stores.service.sansio import RESET, PlanCache, encode_results, read_call

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op
    from ratekeeper.stores.base import AsyncStore

__all__ = ["ACCEPTED", "PLANS", "decide_store_call", "explicit_now_allowed"]

PLANS = PlanCache()
"""The plans rebuilt from clients' rule specs (pure values: one cache per process)."""

ACCEPTED = (
    '{"now": null, "atomic": false, "rules": [[name, algorithm, [[count, period_us, burst]]]], '
    '"ops": [[mode, rule_index, key, cost, max_wait, lease_id]]} (ratekeeper.stores.service.sansio)'
)


def explicit_now_allowed() -> bool:
    return os.environ.get("RATEKEEPER_EXPLICIT_NOW") == "1"


async def _one(store: AsyncStore, op: Op, now: int | None) -> Decision | None:
    mode = op[0]
    if mode == RESET:
        await store.reset(op[1], op[2])
        return None
    if mode == REFUND:
        await store.refund(op, now)
        return None
    return await store.decide(op, now)


async def decide_store_call(store: AsyncStore, body: Any) -> list[Any]:
    """The results of one call (``BadInput`` for a call that cannot be decided at all)."""
    try:
        ops, now, atomic = read_call(body, PLANS)
    except InvalidRequest as exc:
        raise BadInput(400, str(exc), ACCEPTED) from exc
    if now is not None and not explicit_now_allowed():
        raise BadInput(
            400,
            "this service decides on its store's clock: a call may not carry 'now'",
            '"now": null (a service started with RATEKEEPER_EXPLICIT_NOW=1, for tests, accepts one)',
        )
    if atomic:
        try:
            return encode_results(await store.decide_many(ops, now))
        except StoreError as exc:
            status = 504 if isinstance(exc, StoreTimeout) else 503
            raise BadInput(status, f"the service's store failed: {exc}", "a call once the store is back") from exc
        except InvalidRequest as exc:
            raise BadInput(400, str(exc), ACCEPTED) from exc
    results: list[Any] = await asyncio.gather(*(_one(store, op, now) for op in ops), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, RateKeeperError):
            raise result
    return encode_results(results)
