"""``POST /v1/store``: the service as a store for other processes' limiters.

``Limiter("http://host:8082")`` sends its ops here (the wire: ``ratekeeper.stores.
service.protocol``); they are decided in order on the service's own store, as the client's
coalesced calls would be on Redis. The client's limiter applies its own failure policy
and breaker: this route answers what the store did, including its failures per op.

What a client may do here is bounded:

- every field is checked against the schema that ``/openapi.json`` publishes
  (``schema.py``): the bounds the stores decide exactly, so a cost or ``max_wait`` no
  store can hold is a 400 naming the field and its bound, and never reaches a batch
  shared with other callers' ops;
- the rules a client sends live in a namespace of their own (``store-api``, or
  ``store-api/<token name>`` when the admin surface takes tokens): they never share
  state with a configured rule, nor with another token's rules;
- the service keeps at most ``PLANS.cache.bound`` of those rules built, least recently
  used evicted first (the evictions are counted: ``store_api_rules``).

The service decides on its store's clock. A call may carry an explicit ``now`` only when
the service was started with ``RATEKEEPER_EXPLICIT_NOW=1`` (the conformance suite's
traces): otherwise one client could move a key's state in time for every other.
"""

from __future__ import annotations

import asyncio
import os
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import InvalidRequest, RateKeeperError, StoreError, StoreTimeout
from ratekeeper.op import REFUND
from ratekeeper.server.problems import BadInput
from ratekeeper.server.schema import check, request_schemas
from ratekeeper.stores.service.protocol import RESET, PlanCache, encode_results, read_call

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op
    from ratekeeper.stores.base import AsyncStore

__all__ = ["ACCEPTED", "PLANS", "decide_store_call", "explicit_now_allowed"]

PLANS = PlanCache()
"""The plans built from clients' rule specs (one cache per process, bounded: its
``cache`` is the ``BoundedCache`` named ``store_api_rules`` that the metrics export)."""

ACCEPTED = (
    '{"now": null, "atomic": false, "rules": [[name, algorithm, [[count, period_us, burst]]]], '
    '"ops": [[mode, rule_index, key, cost, max_wait, lease_id]]} (ratekeeper.stores.service.protocol)'
)


def explicit_now_allowed() -> bool:
    return os.environ.get("RATEKEEPER_EXPLICIT_NOW") == "1"


@lru_cache(maxsize=2)
def _schemas(explicit_now: bool) -> dict[str, Any]:
    return request_schemas(explicit_now=explicit_now)


async def _one(store: AsyncStore, op: Op, now: int | None) -> Decision | bool | None:
    mode = op[0]
    if mode == RESET:
        await store.reset(op[1], op[2])
        return None
    if mode == REFUND:
        return await store.refund(op, now)
    return await store.decide(op, now)


async def decide_store_call(store: AsyncStore, body: Any, namespace: str) -> list[Any]:
    """The results of one call whose rules live in ``namespace`` (``store-api`` or
    ``store-api/<token name>``: ``surfaces.store_namespace``); ``BadInput`` for a call
    that cannot be decided at all (nothing is decided then)."""
    explicit_now = explicit_now_allowed()
    if isinstance(body, dict) and body.get("now") is not None and not explicit_now:
        raise BadInput(
            400,
            "this service decides on its store's clock: a call may not carry 'now'",
            '"now": null (a service started with RATEKEEPER_EXPLICIT_NOW=1, for tests, accepts one)',
        )
    body = check(_schemas(explicit_now), "StoreCall", body)
    try:
        ops, now, atomic = read_call(body, PLANS, namespace)
    except InvalidRequest as exc:
        raise BadInput(400, str(exc), ACCEPTED) from exc
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
