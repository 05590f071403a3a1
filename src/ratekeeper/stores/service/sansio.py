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
one per op, in order: ``null`` for a reset, ``true``/``false`` for a refund (whether it
gave anything back), ``{"error": message, "timeout": bool}`` when the service's store
failed that op, else the decision::

    [allowed, denied_index, retry_us, delay_us, [remaining...], [reset_us...], lease_id | null]

A request the service refuses (malformed, a field past the stores' bounds, a rule it
cannot build) is a 4xx problem; a store that failed the whole call is a 503 problem:
both become ``StoreError`` here. The client sends ``Authorization: Bearer <secret>``
when it has a secret (``token_file``, else ``RATEKEEPER_SERVICE_TOKEN``); the service
keeps the rules it is sent in the namespace of that token (``PlanCache``).
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.bounded import BoundedCache
from ratekeeper.decision import Decision
from ratekeeper.errors import ConfigurationError, InvalidRequest, RateKeeperError, StoreError, StoreTimeout
from ratekeeper.limit import Limit
from ratekeeper.op import DECIDE, MODES, Op
from ratekeeper.stores.bounds import op_problem, unencodable_at
from ratekeeper.stores.options import bool_option, number_option

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan

__all__ = [
    "MAX_OPS",
    "MAX_PLANS",
    "MAX_RULES",
    "MAX_RULE_NAME",
    "RESET",
    "SERVICE_SCHEMES",
    "STORE_PATH",
    "PlanCache",
    "ServiceOptions",
    "decode_reply",
    "encode_call",
    "encode_results",
    "read_call",
    "read_token",
    "reset_op",
    "store_down",
]

SERVICE_SCHEMES = ("http", "https")
STORE_PATH = "/v1/store"
RESET = "x"
"""The mode of a reset op: on this wire only (the other stores have ``reset(plan, key)``)."""

MAX_OPS = 10_000
"""The most ops one call may carry (the service refuses more)."""


TOKEN_ENV = "RATEKEEPER_SERVICE_TOKEN"
"""Where the bearer secret comes from when the URL names no ``token_file``."""


class ServiceOptions:
    """The options of an ``http://`` / ``https://`` store URL (query or keywords):
    ``timeout`` (seconds, default 1), ``max_in_flight`` (calls out at once, default 8),
    ``max_batch`` (ops per call, default 512), ``batching`` (default true),
    ``token_file`` (a file holding the bearer secret of the service's admin surface; else
    the environment's ``RATEKEEPER_SERVICE_TOKEN``, else no token); for ``https://``,
    ``ca_file`` (PEM CAs to trust instead of the system's) and ``cert_file`` / ``key_file``
    (a client certificate, for a service started with ``--tls-client-ca``)."""

    def __init__(self, url: str, options: dict[str, Any], environ: Mapping[str, str] | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in SERVICE_SCHEMES or not parts.netloc:
            raise ConfigurationError(f"a service store URL looks like http://host:8082, got {url!r}")
        given: dict[str, Any] = dict(parse_qsl(parts.query))
        given.update(options)
        known = {"timeout", "max_in_flight", "max_batch", "batching", "token_file", "ca_file", "cert_file", "key_file"}
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
        self.verify = tls_context(given.get("ca_file"), given.get("cert_file"), given.get("key_file"))
        secret = read_token(given.get("token_file"), os.environ if environ is None else environ)
        self.headers = {"content-type": "application/json"}
        if secret is not None:
            self.headers["authorization"] = f"Bearer {secret}"


def tls_context(ca_file: Any, cert_file: Any, key_file: Any) -> ssl.SSLContext | bool:
    """What the HTTP client verifies the service with: True (the system's CAs) unless a CA
    file or a client certificate is given."""
    if ca_file is None and cert_file is None and key_file is None:
        return True
    if (cert_file is None) != (key_file is None):
        raise ConfigurationError("cert_file and key_file go together (a client certificate and its key)")
    try:
        context = ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
        if cert_file is not None:
            context.load_cert_chain(str(cert_file), str(key_file))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"the TLS files of the service store cannot be used: {exc}") from None
    return context


def read_token(token_file: Any, environ: Mapping[str, str]) -> str | None:
    """The bearer secret: the first line of ``token_file`` that is neither blank nor a
    ``#`` comment, else ``$RATEKEEPER_SERVICE_TOKEN``, else None (no token sent)."""
    if token_file is not None:
        if not isinstance(token_file, str | os.PathLike) or not str(token_file):
            raise ConfigurationError(f"token_file is the path of a file holding the secret, got {token_file!r}")
        try:
            with open(token_file, encoding="utf-8") as f:
                lines = [line.strip() for line in f.read(64 * 1024).splitlines()]
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"token_file {str(token_file)!r} cannot be read: {exc}") from None
        secrets = [line for line in lines if line and not line.startswith("#")]
        if not secrets:
            raise ConfigurationError(f"token_file {str(token_file)!r} holds no secret; write the secret on one line")
        return _secret(secrets[0], f"token_file {str(token_file)!r}")
    value = environ.get(TOKEN_ENV, "").strip()
    return _secret(value, f"${TOKEN_ENV}") if value else None


def _secret(value: str, where: str) -> str:
    # It goes into a header line: printable ASCII without spaces, as the service's token files have it.
    if not value.isascii() or not value.isprintable() or " " in value:
        raise ConfigurationError(f"{where}: a secret is printable ASCII without spaces (one secret, one line)")
    return value


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
    if status == 401:
        raise StoreError(
            f"the ratekeeper service answered 401: {reason}; give the store URL a token_file=/path (or set "
            f"{TOKEN_ENV}) holding a secret of the service's admin tokens"
        )
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
