"""The ratekeeper service as a store: what to send to ``POST /v1/store`` and how to read it.

No I/O: the client shells (``calls_async.py`` -> ``calls.py``) and the service's handler
(``ratekeeper.server.store_api``) both use this module, so the two ends of the wire are
written once. The rule travels with each call (as gubernator does): the service needs
no rules file to decide for a client, and a client's quota plans work as they are.

Request (JSON)::

    {"now": null | µs,            null: the service's store decides on its own clock
     "atomic": false | true,      true: every DECIDE op is charged or none (try_acquire_many)
     "rules": [[name, algorithm, [[count, period_us, burst | null], ...]], ...],
     "ops": [[mode, rule_index, key, cost, max_wait | null, lease_id | null], ...]}

``mode`` is an ``Op`` mode ("d", "p", "r") or "x" (reset). Reply: ``{"results": [...]}``,
one per op, in order: ``null`` for a refund or reset, ``{"error": message, "timeout":
bool}`` when the service's store failed that op, else the decision::

    [allowed, denied_index, retry_us, delay_us, [remaining...], [reset_us...], lease_id | null]

A request the service refuses (malformed, a rule it cannot build) is a 4xx problem; a
store that failed the whole call is a 503 problem: both become ``StoreError`` here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ratekeeper.decision import Decision
from ratekeeper.errors import ConfigurationError, InvalidRequest, RateKeeperError, StoreError, StoreTimeout
from ratekeeper.limit import Limit
from ratekeeper.op import DECIDE, MODES, Op
from ratekeeper.rule import MAX_KEY_LENGTH
from ratekeeper.stores.options import bool_option, number_option

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan

__all__ = [
    "RESET",
    "SERVICE_SCHEMES",
    "STORE_PATH",
    "PlanCache",
    "ServiceOptions",
    "decode_reply",
    "encode_call",
    "encode_results",
    "read_call",
    "reset_op",
    "store_down",
]

SERVICE_SCHEMES = ("http", "https")
STORE_PATH = "/v1/store"
RESET = "x"
"""The mode of a reset op: on this wire only (the other stores have ``reset(plan, key)``)."""

MAX_OPS = 10_000
"""The most ops one call may carry (the service refuses more)."""


class ServiceOptions:
    """The options of an ``http://`` / ``https://`` store URL (query or keywords):
    ``timeout`` (seconds, default 1), ``max_in_flight`` (calls out at once, default 8),
    ``max_batch`` (ops per call, default 512), ``batching`` (default true)."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in SERVICE_SCHEMES or not parts.netloc:
            raise ConfigurationError(f"a service store URL looks like http://host:8080, got {url!r}")
        given: dict[str, Any] = dict(parse_qsl(parts.query))
        given.update(options)
        known = {"timeout", "max_in_flight", "max_batch", "batching"}
        unknown = set(given) - known
        if unknown:
            raise ConfigurationError(
                f"unknown option(s) {sorted(unknown)} for {parts.scheme}://; accepted: {', '.join(sorted(known))}"
            )
        self.base_url = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self.timeout: float = number_option("timeout", given.get("timeout", 1.0), float, 0.001)
        self.max_in_flight: int = number_option("max_in_flight", given.get("max_in_flight", 8), int, 1)
        self.max_batch: int = min(number_option("max_batch", given.get("max_batch", 512), int, 1), MAX_OPS)
        self.batching: bool = bool_option("batching", given.get("batching", True))


def reset_op(plan: Plan, key: str) -> Op:
    return Op((RESET, plan, key, 0, None, None))


# -- the client's end ------------------------------------------------------------------


def _rule_spec(plan: Plan) -> list[Any]:
    """What the service needs to rebuild ``plan`` (kept on the plan: built once)."""
    try:
        return plan.derived["service"]  # type: ignore[no-any-return]
    except KeyError:
        spec = [plan.name, plan.algorithm.name, [[x.count, x.period_us, x.burst] for x in plan.limits]]
        plan.derived["service"] = spec
        return spec


def encode_call(ops: Sequence[Op], now: int | None, atomic: bool) -> bytes:
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
    return json.dumps({"now": now, "atomic": atomic, "rules": rules, "ops": wire_ops}, separators=(",", ":")).encode()


def read_response(status: int, body: bytes) -> list[Any]:
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
    raise StoreError(f"the ratekeeper service answered {status}: {reason}")


def decode_reply(ops: Sequence[Op], results: Sequence[Any]) -> list[Decision | StoreError | bool | None]:
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


def store_down(exc: BaseException) -> bool:
    """Whether ``exc`` says the service timed out or is unreachable (the callers queued
    behind the call that found it so get its error at once)."""
    return isinstance(exc, StoreTimeout) or (isinstance(exc, StoreError) and isinstance(exc.__cause__, OSError))


# -- the service's end -----------------------------------------------------------------


class PlanCache:
    """The plans the service rebuilt from clients' rule specs, reused across calls and
    bounded (``max_plans``: cleared when full; rules are few, so it rarely is)."""

    def __init__(self, max_plans: int = 10_000) -> None:
        self.max_plans = max_plans
        self.plans: dict[tuple[Any, ...], Plan] = {}

    def plan(self, spec: Any) -> Plan:
        from ratekeeper.algorithms import get_algorithm

        if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[2], list) and spec[2]):
            raise InvalidRequest(f"a rule is [name, algorithm, [[count, period_us, burst], ...]], got {spec!r}")
        name, algorithm, limits = spec
        if not isinstance(name, str) or not name or not isinstance(algorithm, str):
            raise InvalidRequest(f"a rule needs a name and an algorithm (strings), got {spec!r}")
        for item in limits:
            if not (isinstance(item, list) and len(item) == 3 and all(_is_int(v) for v in item[:2])):
                raise InvalidRequest(f"a limit is [count, period_us, burst | null], got {item!r}")
            if item[2] is not None and not _is_int(item[2]):
                raise InvalidRequest(f"a limit's burst is an integer or null, got {item[2]!r}")
        frozen = (name, algorithm, tuple(tuple(x) for x in limits))
        plan = self.plans.get(frozen)
        if plan is not None:
            return plan
        try:
            parsed = [Limit.from_us(item[0], item[1], item[2]) for item in limits]
            plan = get_algorithm(algorithm).plan(name, tuple(parsed))
        except RateKeeperError as exc:
            raise InvalidRequest(f"rule {name!r}: {exc}") from exc
        if len(self.plans) >= self.max_plans:
            self.plans.clear()
        self.plans[frozen] = plan
        return plan


def _is_int(value: Any) -> bool:
    return type(value) is int


def read_call(doc: Any, plans: PlanCache) -> tuple[list[Op], int | None, bool]:
    """The ops, ``now`` and ``atomic`` of a request body; ``InvalidRequest`` saying what is
    wrong with it otherwise (nothing is decided then)."""
    if not isinstance(doc, dict) or set(doc) - {"now", "atomic", "rules", "ops"}:
        raise InvalidRequest('a store call is {"now", "atomic", "rules", "ops"}')
    now, atomic, specs, wire_ops = doc.get("now"), doc.get("atomic", False), doc.get("rules"), doc.get("ops")
    if now is not None and (not _is_int(now) or now < 0):
        raise InvalidRequest(f"now is null or a non-negative integer (µs), got {now!r}")
    if not isinstance(atomic, bool):
        raise InvalidRequest(f"atomic is true or false, got {atomic!r}")
    if not isinstance(specs, list) or not isinstance(wire_ops, list) or not wire_ops:
        raise InvalidRequest("rules and ops are lists, ops not empty")
    if len(wire_ops) > MAX_OPS:
        raise InvalidRequest(f"a call carries at most {MAX_OPS} ops, got {len(wire_ops)}")
    built = [plans.plan(spec) for spec in specs]
    ops: list[Op] = []
    for item in wire_ops:
        if not (isinstance(item, list) and len(item) == 6):
            raise InvalidRequest(f"an op is [mode, rule_index, key, cost, max_wait, lease_id], got {item!r}")
        mode, i, key, cost, max_wait, lease_id = item
        if mode not in (*MODES, RESET):
            raise InvalidRequest(f"an op's mode is one of {[*MODES, RESET]}, got {mode!r}")
        if not _is_int(i) or not 0 <= i < len(built):
            raise InvalidRequest(f"an op's rule_index names one of the {len(built)} rules, got {i!r}")
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
            raise InvalidRequest(f"a key is a string of 1 to {MAX_KEY_LENGTH} characters, got {key!r:.80}")
        if not _is_int(cost) or cost < 0:
            raise InvalidRequest(f"a cost is a non-negative integer, got {cost!r}")
        if max_wait is not None and (not _is_int(max_wait) or max_wait < 0):
            raise InvalidRequest(f"max_wait is null or a non-negative integer (µs), got {max_wait!r}")
        if lease_id is not None and (not isinstance(lease_id, str) or not lease_id):
            raise InvalidRequest(f"lease_id is null or a non-empty string, got {lease_id!r}")
        ops.append(Op((mode, built[i], key, cost, max_wait, lease_id)))
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
