"""``POST /v1/store``, the wire between the service store and the service: its bounds, and
the service's end (``read_call``, ``PlanCache``, ``encode_results``), without I/O. The
client's end is ``ServicePlanner`` (``planner.py``); the service's handler
(``ratekeeper.server.store_api``) uses this module. The rule travels with each call (as
gubernator does): the service needs no rules file to decide for a client, and a client's
quota plans work as they are.

Request (JSON)::

    {"now": null | µs,            null: the service's store decides on its own clock
     "atomic": false | true,      true: every DECIDE op is charged or none (try_acquire_many)
     "rules": [[name, algorithm, [[count, period_us, burst | null], ...]], ...],
     "ops": [[mode, rule_index, key, cost, max_wait | null, lease_id | null], ...]}

``mode`` is an ``Op`` mode ("d", "p", "r", "c") or "x" (reset). Reply: ``{"results": [...]}``,
one per op, in order: ``null`` for a reset, ``true``/``false`` for a refund (whether it
gave anything back), ``{"error": message, "timeout": bool}`` when the service's store
failed that op, else the decision::

    [allowed, denied_index, retry_us, delay_us, [remaining...], [reset_us...], lease_id | null]

(a remaining is below 0 after a charge without a check, "c", that left the key in debt).

A request the service refuses (malformed, a field past the stores' bounds, a rule it
cannot build) is a 4xx problem; a store that failed the whole call is a 503 problem:
both become ``StoreError`` in the client (``ServicePlanner.read``). The client sends ``Authorization: Bearer <secret>``
when it has a secret (``token_file``, else ``RATEKEEPER_SERVICE_TOKEN``); the service
keeps the rules it is sent in the namespace of that token (``PlanCache``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.bounded import BoundedCache
from ratekeeper.errors import InvalidRequest, RateKeeperError, StoreTimeout
from ratekeeper.limit import Limit
from ratekeeper.op import DECIDE, MODES, Op
from ratekeeper.stores.bounds import op_problem, unencodable_at

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision

__all__ = [
    "MAX_OPS",
    "MAX_PLANS",
    "MAX_RULES",
    "MAX_RULE_NAME",
    "RESET",
    "STORE_PATH",
    "PlanCache",
    "encode_results",
    "read_call",
    "reset_op",
]

STORE_PATH = "/v1/store"
RESET = "x"
"""The mode of a reset op: on this wire only (the other stores have ``reset(plan, key)``)."""

MAX_OPS = 10_000
"""The most ops one call may carry (the service refuses more)."""


def reset_op(plan: Plan, key: str) -> Op:
    return Op((RESET, plan, key, 0, None, None))


MAX_RULES = 256
"""The most rules one call may carry."""
MAX_RULE_NAME = 256
"""The longest rule name a call may carry (in characters)."""
MAX_PLANS = 10_000
"""The default bound on the rules the service keeps built for store-API clients."""


class PlanCache:
    """The plans the service built from clients' rule specs, reused across calls: at most
    ``bound`` (a ``BoundedCache``, least recently used evicted first, evictions counted).

    A rule a client sends lives in the client's ``namespace`` (``store-api`` or
    ``store-api/<token name>``): its plan is named ``<namespace>:<name>``, so its stored
    state (which every store keys by the plan's name) is never a configured rule's and
    never another token's. Token names hold no ``:``, so the name is unambiguous.

    Within a namespace a plan's state is shared as on every store: by name, algorithm
    and scale (``Plan.table``), so a fleet's processes share their rules' state and a
    rule whose limits change keeps it when it means the same. Two specs of one name that
    differ only in count or burst therefore share state; only clients holding the same
    token can do that to each other, and they can already charge, refund and reset every
    key of that namespace. Evicting a plan loses no state: the next call builds it again
    and finds the same storage key.
    """

    def __init__(self, bound: int = MAX_PLANS) -> None:
        self.cache: BoundedCache[tuple[Any, ...], Plan] = BoundedCache(bound, "store_api_rules")

    def plan(self, spec: Any, namespace: str = "store-api") -> Plan:
        """The plan of a checked spec ``[name, algorithm, [[count, period_us, burst], ...]]``
        (``InvalidRequest`` when its limits cannot be built: a bucket too fine for exact
        arithmetic, a burst on an algorithm without one)."""
        if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[2], list) and spec[2]):
            raise InvalidRequest(f"a rule is [name, algorithm, [[count, period_us, burst], ...]], got {spec!r:.200}")
        name, algorithm, limits = spec
        if not isinstance(name, str) or not 0 < len(name) <= MAX_RULE_NAME or algorithm not in ALGORITHMS:
            raise InvalidRequest(
                f"a rule needs a name (1 to {MAX_RULE_NAME} characters) and one of the algorithms "
                f"{sorted(ALGORITHMS)}, got {spec!r:.200}"
            )
        if unencodable_at(name) is not None:
            raise InvalidRequest(f"rule name {name!r:.200} holds a lone surrogate, which no store can encode")
        for item in limits:
            if not (isinstance(item, list) and len(item) == 3 and all(_is_int(v) for v in item[:2])):
                raise InvalidRequest(f"a limit is [count, period_us, burst | null], got {item!r:.200}")
            if item[2] is not None and not _is_int(item[2]):
                raise InvalidRequest(f"a limit's burst is an integer or null, got {item[2]!r:.60}")
        frozen = (namespace, name, algorithm, tuple(tuple(x) for x in limits))
        if frozen in self.cache:
            return self.cache.get(frozen, _unreachable)
        try:
            parsed = tuple(Limit.from_us(item[0], item[1], item[2]) for item in limits)
            plan = ALGORITHMS[algorithm].plan(f"{namespace}:{name}", parsed)
        except RateKeeperError as exc:
            raise InvalidRequest(f"rule {name!r}: {exc}") from exc
        return self.cache.get(frozen, lambda: plan)


def _unreachable() -> Plan:
    raise AssertionError("the plan is cached")


def _is_int(value: Any) -> bool:
    return type(value) is int


def read_call(doc: Any, plans: PlanCache, namespace: str = "store-api") -> tuple[list[Op], int | None, bool]:
    """The ops, ``now`` and ``atomic`` of a request body, their rules built in
    ``namespace`` (see ``PlanCache``); ``InvalidRequest`` saying what is wrong with it
    otherwise (nothing is decided then). The service checks each field against its
    schema first (``ratekeeper.server.schema``); this checks again what the stores need
    and what no schema can say (an op's rule_index names one of the call's rules, an
    atomic call holds DECIDE ops only, every op within ``stores.bounds``)."""
    if not isinstance(doc, dict) or set(doc) - {"now", "atomic", "rules", "ops"}:
        raise InvalidRequest('a store call is {"now", "atomic", "rules", "ops"}')
    now, atomic, specs, wire_ops = doc.get("now"), doc.get("atomic", False), doc.get("rules"), doc.get("ops")
    if not isinstance(atomic, bool):
        raise InvalidRequest(f"atomic is true or false, got {atomic!r:.60}")
    if not isinstance(specs, list) or not isinstance(wire_ops, list) or not wire_ops:
        raise InvalidRequest("rules and ops are lists, ops not empty")
    if len(wire_ops) > MAX_OPS or len(specs) > MAX_RULES:
        raise InvalidRequest(f"a call carries at most {MAX_RULES} rules and {MAX_OPS} ops")
    built = [plans.plan(spec, namespace) for spec in specs]
    ops: list[Op] = []
    for n, item in enumerate(wire_ops):
        if not (isinstance(item, list) and len(item) == 6):
            raise InvalidRequest(f"an op is [mode, rule_index, key, cost, max_wait, lease_id], got {item!r:.200}")
        mode, i, key, cost, max_wait, lease_id = item
        if mode not in (*MODES, RESET):
            raise InvalidRequest(f"ops[{n}]: an op's mode is one of {[*MODES, RESET]}, got {mode!r:.40}")
        if not _is_int(i) or not 0 <= i < len(built):
            raise InvalidRequest(f"ops[{n}]: rule_index names one of the call's {len(built)} rules, got {i!r:.40}")
        op = Op((mode, built[i], key, cost, max_wait, lease_id))
        # A reset names only its rule and key; every other op is what a store decides.
        problem = op_problem(Op((DECIDE, *op[1:])) if mode == RESET else op, now)
        if problem is not None:
            raise InvalidRequest(f"ops[{n}]: {problem}")
        ops.append(op)
    if atomic and any(op[0] != DECIDE for op in ops):
        raise InvalidRequest("an atomic call carries DECIDE ops only")
    return ops, now, atomic


def encode_results(results: Sequence[Decision | BaseException | None]) -> list[Any]:
    """The reply's results: decisions, nulls (refunds, resets) and the store's failures."""
    out: list[Any] = []
    for result in results:
        if result is None or isinstance(result, bool):
            out.append(result)
        elif isinstance(result, BaseException):
            out.append({"error": f"{type(result).__name__}: {result}", "timeout": isinstance(result, StoreTimeout)})
        else:
            out.append([result[2], result[3], result[4], result[5], list(result[6]), list(result[7]), result[8]])
    return out
