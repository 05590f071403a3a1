"""Envoy's rate-limit protocol (``envoy.service.ratelimit.v3``), for gRPC and ``POST /json``.

``should_rate_limit(service, request)`` answers one ``RateLimitRequest`` with one
``RateLimitResponse`` as Envoy's reference service does (docs/service.md lists where it
deliberately differs).

- The domain's Envoy-form rules file resolves each descriptor (``EnvoyConfig.resolve_all``,
  ``replaces`` applied). A descriptor that no limit matches, one without entries, and every
  descriptor of an unknown domain (a ``limit`` override too) are ``OK`` with no
  ``current_limit``; an ``unlimited`` one is ``OK`` with 4294967295 left; a
  ``requests_per_unit: 0`` one is over its limit without asking the store.
- Hits: the request's ``hits_addend`` (0 means 1, as in Envoy), overridden per descriptor
  by its ``hits_addend`` (a wrapper: set to 0, the descriptor only reports what is left).
- A descriptor's ``limit`` override (``requests_per_unit`` per ``unit``) replaces the
  configured limit for that descriptor with a fixed window of that size, as in Envoy: a
  plain limit without a name. Each distinct (domain, size, unit) is a rule the client made:
  the service keeps at most ``MAX_OVERRIDE_RULES`` of them (``OverrideRules``), the least
  recently used evicted first, with its state in the memory store (the state a Redis or
  PostgreSQL store keeps expires on its own). While a rule is kept, every request with the
  same override shares its counters, as in Envoy; an evicted one starts again from zero.
  The metrics show the bound and the evictions (``cache="envoy_overrides"``) and count the
  decisions of override rules under ``rule="_other"``.
- Which descriptors are charged, and the overall code (``shadow_mode``, ``quota_mode``):
  ``envoy_charging``; the service-wide shadow mode lets every request through.
- Each status: ``code``, ``current_limit`` (the limit that refused, else the tightest:
  ``name`` as the YAML writes it, ``requests_per_unit``, ``unit``), ``limit_remaining`` (0
  when over), ``duration_until_reset`` (to the end of the epoch-aligned window).
- ``response_headers_to_add``: ``RateLimit-Policy``, ``RateLimit``, ``X-RateLimit-*`` and
  ``Retry-After`` on a refusal (DESIGN 5.3), for the enforced, limited descriptors.

Bad requests (no domain, no descriptors, an empty entry key, a hit count over
``MAX_COST``, a malformed override: fewer than 1 request or a unit that is not SECOND to
YEAR) raise ``BadInput``: ``INVALID_ARGUMENT`` over gRPC, 400 over HTTP. They are found
before any override rule is made: a bad request leaves nothing behind.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envoy.service.ratelimit.v3 import rls_pb2  # type: ignore[import-untyped]
from google.protobuf import json_format  # type: ignore[import-untyped]

from ratekeeper.bounded import BoundedCache
from ratekeeper.config.envoy import UNIT_SECONDS
from ratekeeper.decision import INFINITE
from ratekeeper.keys import bounded_key
from ratekeeper.limit import Limit
from ratekeeper.rule import Rule
from ratekeeper.server.envoy_charging import Slot, Verdict, charge, charging_for, overall_ok
from ratekeeper.server.inputs import MAX_COST
from ratekeeper.server.problems import BadInput
from ratekeeper.web.headers import rate_limit_headers

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.server.service import Service

__all__ = ["MAX_DESCRIPTORS", "MAX_OVERRIDE_RULES", "OverrideRules", "envoy_json", "overrides_of", "should_rate_limit"]

Response: Any = rls_pb2.RateLimitResponse
RateLimit: Any = rls_pb2.RateLimitResponse.RateLimit

MAX_DESCRIPTORS = 64
"""The most descriptors one request may carry."""

MAX_OVERRIDE_RULES = 1_024
"""The most override rules a service keeps (see ``OverrideRules``)."""

_UNITS = (
    (1, RateLimit.SECOND, "second"),
    (60, RateLimit.MINUTE, "minute"),
    (3_600, RateLimit.HOUR, "hour"),
    (86_400, RateLimit.DAY, "day"),
    (604_800, RateLimit.WEEK, "week"),
    (2_592_000, RateLimit.MONTH, "month"),
    (31_536_000, RateLimit.YEAR, "year"),
)
_UNIT_OF_SECONDS = {seconds * 1_000_000: unit for seconds, unit, _ in _UNITS}
_SECONDS_OF_UNIT = {unit: seconds for seconds, unit, _ in _UNITS}


async def should_rate_limit(service: Service, request: Any) -> Any:
    """The answer to one request (see the module docstring)."""
    if not request.domain:
        raise BadInput(400, "the request has no domain", "the domain of an Envoy-form rules file")
    n = len(request.descriptors)
    if not 1 <= n <= MAX_DESCRIPTORS:
        raise BadInput(400, f"the request has {n} descriptors", f"1 to {MAX_DESCRIPTORS} descriptors")
    default_hits = request.hits_addend or 1
    entries: list[list[tuple[str, str]]] = []
    for i, descriptor in enumerate(request.descriptors):
        pairs = [(e.key, e.value) for e in descriptor.entries]
        if any(not k for k, _ in pairs):
            raise BadInput(400, f"descriptor {i} has an entry without a key", "entries with a key each")
        entries.append(pairs)
    config = service.catalog.envoy.get(request.domain)
    limits: list[Any] = config.resolve_all(entries) if config is not None else [None] * n

    hits_of: list[int] = []
    overridden: dict[int, tuple[int, int]] = {}  # descriptor -> its override's size and unit
    for i, descriptor in enumerate(request.descriptors):
        hits = descriptor.hits_addend.value if descriptor.HasField("hits_addend") else default_hits
        if hits > MAX_COST:
            raise BadInput(400, f"descriptor {i} adds {hits} hits", f"hits_addend of at most {MAX_COST}")
        hits_of.append(hits)
        if descriptor.HasField("limit"):
            checked = _checked_override(descriptor.limit.requests_per_unit, descriptor.limit.unit, i)
            # As in Envoy, an unknown domain applies no limit, overridden or not; nor does a
            # descriptor without entries (there is nothing to key its count by).
            if config is not None and entries[i]:
                overridden[i] = checked

    # Every check passed: only now are override rules made (or found) and used.
    overrides = overrides_of(service) if overridden else None
    answers: list[_Answer] = []
    slots: list[Slot] = []
    for i, hits in enumerate(hits_of):
        found = limits[i] if entries[i] else None
        if overrides is not None and i in overridden:
            # An override is a plain limit, never shadow nor quota, and has no name (as in Envoy).
            rule = overrides.rule(request.domain, *overridden[i])
            key = found.key if found is not None else ".".join(f"{k}_{v}" if v else k for k, v in entries[i])
            answers.append(_Answer(slot=len(slots)))
            slots.append(Slot(rule, bounded_key(key), hits))
        elif found is None:
            answers.append(_Answer())
        elif found.unlimited:
            answers.append(_Answer(unlimited=True))
        elif getattr(found, "blocked", False) or found.rule is None:
            answers.append(_Answer(blocked=found))
        else:
            answers.append(_Answer(slot=len(slots), name=getattr(found, "name", "")))
            slots.append(
                Slot(
                    found.rule,
                    bounded_key(found.key),
                    hits,
                    shadow=bool(found.shadow),
                    quota=bool(getattr(found, "quota_mode", False)),
                )
            )

    start = time.perf_counter()
    try:
        verdicts = await charge(service.limiter, slots, charging_for(service, config))
    finally:
        if overrides is not None:
            overrides.settle((request.domain, *size_unit) for size_unit in overridden.values())
    outcomes: list[tuple[bool, bool, bool]] = []  # (shadow, quota, over) of each limited descriptor
    for answer in answers:
        if answer.slot is not None:
            slot = slots[answer.slot]
            outcomes.append((slot.shadow, slot.quota, verdicts[answer.slot].over))
        elif answer.blocked is not None:
            outcomes.append((bool(answer.blocked.shadow), bool(getattr(answer.blocked, "quota_mode", False)), True))
    # The service-wide shadow mode (Envoy's SHADOW_MODE) lets the request through; each
    # descriptor's status still says what it would have been.
    ok = overall_ok(outcomes) or bool(getattr(config, "global_shadow", False))
    if slots:  # the limiter decided something: its time, as /v1/check reports it
        service.metrics.decision_time(time.perf_counter() - start, ok)
    response = Response(overall_code=Response.OK if ok else Response.OVER_LIMIT)
    for answer in answers:
        status = response.statuses.add()
        status.code = Response.OK
        if answer.unlimited:
            status.limit_remaining = UNLIMITED_REMAINING
        elif answer.blocked is not None:
            _describe_blocked(status, answer.blocked)
        elif answer.slot is not None:
            slot, verdict = slots[answer.slot], verdicts[answer.slot]
            if verdict.over and not slot.shadow:
                status.code = Response.OVER_LIMIT
            _describe(status, verdict, slot.rule, answer.name)
    enforced = [(s.rule, v.decision) for s, v in zip(slots, verdicts, strict=True) if not s.shadow]
    for name, value in rate_limit_headers(enforced, allowed=ok):
        response.response_headers_to_add.add(key=name, value=value)
    return response


UNLIMITED_REMAINING = 2**32 - 1
"""``limit_remaining`` of an unlimited descriptor, as Envoy answers it."""


@dataclass(frozen=True, slots=True)
class _Answer:
    """How one descriptor is answered: by its slot's verdict, as unlimited, as blocked
    (``requests_per_unit: 0``: over without asking the store), or with no limit."""

    slot: int | None = None
    name: str = ""
    unlimited: bool = False
    blocked: Any = None


def _describe(status: Any, verdict: Verdict, rule: Rule, name: str) -> None:
    """``current_limit``, ``limit_remaining`` and ``duration_until_reset`` of one verdict."""
    decision = verdict.decision
    limits = decision.rule_limits
    if not limits:
        return
    i = decision.denied_index
    if i < 0:
        remaining = decision.remaining_each
        i = min(range(len(limits)), key=lambda j: (remaining[j], -decision.reset_us[j]))
    limit = limits[i]
    status.current_limit.name = name
    status.current_limit.requests_per_unit = min(limit.count, 2**32 - 1)
    status.current_limit.unit = _UNIT_OF_SECONDS.get(limit.period_us, RateLimit.UNKNOWN)
    left = 0 if verdict.over else decision.remaining_each[i] + verdict.unspent
    status.limit_remaining = max(0, min(left, 2**32 - 1))
    us = decision.reset_us[i]
    if i == decision.denied_index and decision.retry_us != INFINITE and rule.algorithm != "fixed_window":
        us = decision.retry_us  # a bucket frees room before it is whole again
    if us <= 0 and rule.algorithm == "fixed_window":
        us = _window_left_us(limit.period_us)  # nothing counted yet: the window still ends on the clock
    status.duration_until_reset.FromMicroseconds(max(0, us))


def _describe_blocked(status: Any, found: Any) -> None:
    """A ``requests_per_unit: 0`` limit: over (OK in shadow mode) with nothing left."""
    status.code = Response.OK if found.shadow else Response.OVER_LIMIT
    status.current_limit.name = getattr(found, "name", "")
    status.current_limit.requests_per_unit = 0
    seconds = UNIT_SECONDS.get(str(getattr(found, "unit", "") or "").lower())
    status.current_limit.unit = _UNIT_OF_SECONDS.get(seconds * 1_000_000, RateLimit.UNKNOWN) if seconds else 0
    if seconds:
        status.duration_until_reset.FromMicroseconds(_window_left_us(seconds * 1_000_000))


def _window_left_us(period_us: int) -> int:
    """Until the end of the current window of ``period_us``, windows counted from the Unix
    epoch as every store counts them."""
    return period_us - time.time_ns() // 1000 % period_us


def _checked_override(requests: int, unit: int, i: int) -> tuple[int, int]:
    """A descriptor's ``limit`` override, when it is one the service can apply."""
    if unit not in _SECONDS_OF_UNIT or requests < 1:
        # An open enum: a client may send any number, which has no name to show.
        unit_name = RateLimit.Unit.Name(unit) if unit in RateLimit.Unit.values() else f"unit {unit}"
        raise BadInput(
            400,
            f"descriptor {i} overrides the limit with {requests} per {unit_name}",
            "requests_per_unit >= 1 and a unit from SECOND (1) to YEAR (6), or 7 (a week)",
        )
    return requests, unit


class OverrideRules:
    """The rules of ``limit`` overrides: one per (domain, size, unit), at most ``bound``.

    They live in a ``BoundedCache``: the least recently used rule is evicted to make room
    for a new one, and the memory store behind the limiter forgets its table then, so
    neither the rules nor their state grow with what clients send. ``forget(plan)`` is
    that store's ``forget`` (None for stores whose state expires by itself).
    """

    def __init__(self, bound: int = MAX_OVERRIDE_RULES, forget: Callable[[Plan], object] | None = None) -> None:
        self.forget = forget
        self.cache: BoundedCache[tuple[str, int, int], Rule] = BoundedCache(
            bound, "envoy_overrides", on_evict=self._evicted
        )

    def rule(self, domain: str, requests: int, unit: int) -> Rule:
        """The rule of one override (checked by ``_checked_override``), made if missing."""
        return self.cache.get((domain, requests, unit), lambda: _override_rule(domain, requests, unit))

    def settle(self, used: Iterable[tuple[str, int, int]]) -> None:
        """After a request: forget the state of the overrides it used (``(domain, size,
        unit)``) that were evicted meanwhile (by its own later descriptors, or by a request
        that ran while it waited on the store), since its decision may have written them
        again. One evicted and made again since is in use: its state stays."""
        if self.forget is None:
            return
        for key in used:
            if key not in self.cache:
                self.forget(_override_rule(*key).plan)

    def _evicted(self, key: tuple[str, int, int], rule: Rule) -> None:
        if self.forget is not None:
            self.forget(rule.plan)


_OVERRIDES: weakref.WeakKeyDictionary[Service, OverrideRules] = weakref.WeakKeyDictionary()


def overrides_of(service: Service) -> OverrideRules:
    """The override rules of ``service``, made on first use with its metrics watching them
    (``cache="envoy_overrides"``); calling it at start shows the bound before any override."""
    overrides = _OVERRIDES.get(service)
    if overrides is None:
        overrides = _OVERRIDES[service] = OverrideRules(forget=_forget_of(service.limiter.store))
        service.metrics.watch_cache(overrides.cache.name, overrides.cache)
    return overrides


def _forget_of(store: object) -> Callable[[Plan], object] | None:
    """The ``forget`` of the memory store under the limiter's wrappers (the observer, the
    over-limit cache, the asyncio adapter: each holds the next as ``store`` or ``sync``);
    None for a store whose state expires on its own (Redis, PostgreSQL, a service)."""
    for _ in range(8):  # a handful of wrappers at most; never loop on a cycle
        forget = getattr(store, "forget", None)
        if callable(forget):
            return forget  # type: ignore[no-any-return]
        store = getattr(store, "store", None) or getattr(store, "sync", None)
        if store is None:
            break
    return None


def _override_rule(domain: str, requests: int, unit: int) -> Rule:
    seconds = _SECONDS_OF_UNIT[unit]
    name = f"{domain}.override.{requests}_per_{RateLimit.Unit.Name(unit).lower()}"
    return Rule(name, [Limit(requests, seconds)], algorithm="fixed_window")


def _check_hits(obj: dict[str, Any], where: str) -> None:
    """Hits must be JSON integers from 0 to ``MAX_COST`` (or null): the proto3 mapping would
    also take strings of digits and values up to 2**64, which the service does not."""
    for name in ("hitsAddend", "hits_addend"):
        value = obj.get(name)
        if value is None:
            continue
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not whole or not 0 <= value <= MAX_COST:
            raise BadInput(400, f"{where}: {name} is {value!r}", f"an integer from 0 to {MAX_COST}, or null")


async def envoy_json(service: Service, body: Any) -> tuple[int, dict[str, Any]]:
    """``POST /json``: the request in the proto3 JSON mapping; 200 (``OK``) or 429
    (``OVER_LIMIT``) with the response in the same mapping."""
    if not isinstance(body, dict):
        raise BadInput(400, "the body must be a JSON object", "a RateLimitRequest in the proto3 JSON mapping")
    _check_hits(body, "the request")
    descriptors = body.get("descriptors")
    if isinstance(descriptors, list):
        for i, d in enumerate(descriptors):
            if isinstance(d, dict):
                _check_hits(d, f"descriptor {i}")
    request = rls_pb2.RateLimitRequest()
    try:
        json_format.ParseDict(body, request)
    except json_format.ParseError as exc:
        raise BadInput(
            400,
            f"not a RateLimitRequest: {exc}",
            '{"domain": "...", "descriptors": [{"entries": [{"key": "...", "value": "..."}]}], "hitsAddend": 1}',
        ) from None
    response = await should_rate_limit(service, request)
    doc = json_format.MessageToDict(response)
    return (200 if response.overall_code == Response.OK else 429), doc
