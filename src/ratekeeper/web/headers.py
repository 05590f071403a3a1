"""The rate-limit headers of a response: ``rate_limit_headers``, the one function that
the web integrations (``web.core``) and the service (``server.http_app``, ``server.envoy``)
build them with.

Two families, each of which can be switched off (``HeaderOptions``):

- ``RateLimit-Policy`` and ``RateLimit``, the structured fields of
  draft-ietf-httpapi-ratelimit-headers-11: one list member per limit of every enforced
  rule that decided the request. A rule with one limit is one policy named after the
  rule (``"items.list";q=1;w=2`` and ``"items.list";r=0;t=2``); a rule with several
  limits names each after the rule and the limit's window (``"auth.create_token.60s"``,
  ``"auth.create_token.3s"``). ``t`` is the seconds until more quota (the refusing
  limit's retry time on a denial, else the time until the limit is whole again), rounded
  up.
- ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset``: one limit only, the one that
  refused (the latest to free up, when several did) or else the one with the least left.
  ``-Reset`` is, by default, the number of seconds from now (rounded up); with
  ``HeaderOptions(reset="epoch")`` it is the Unix time in whole seconds (rounded up) at
  which that is, as flask-limiter, slowapi and GitHub send it.

What the headers say is true, or they say nothing:

- A policy is advertised only when it states the limit exactly in whole seconds (``w``
  is an integer in the draft): ``10/100ms`` is ``q=100;w=1`` (the same rate over the
  shortest whole-second window that holds a whole number of the limit's windows) and
  ``10/1500ms`` is ``q=20;w=3``. A window that needs more than ``MAX_SCALE`` of itself to
  make whole seconds (``1/1234567us``) is left out of both fields: no whole-second policy
  states it. ``RateLimit``'s ``r`` is what the limit still admits now, in its own window.
- Concurrency rules are not rates (a lease is held for the request, not for a window):
  they are left out of every quota header. Their refusal still has ``Retry-After``.
- A decision made by the failure policy while the store was unreachable (``allow`` or
  ``deny``) knows nothing of the quota: no quota header is sent for it. A ``deny`` refusal
  has ``Retry-After`` set to the circuit breaker's remaining cool-down. (``local``
  decisions are real counts of the process's own fallback limiter and are reported.)
- A cost that can never be admitted (more than a limit's capacity) has nothing left for
  it: ``r=0`` and ``X-RateLimit-Remaining: 0``, and ``t`` / ``-Reset`` the time until the
  limit's window is whole again (the limit's whole window when nothing is counted yet),
  never 0, which would tell the client to retry at once. ``Retry-After`` is left out:
  waiting does not help.

``Retry-After`` (a refusal only) is the time until every refusing rule admits the
request again, in whole seconds rounded up and never 0.

The five rate-limit fields can be sent under other names, or left out one by one
(``header_names``, resolved once by ``header_names()`` into ``HeaderOptions.names``: a
request only unpacks a tuple): ``{"X-RateLimit-Limit": "X-Rate-Limit-Limit", ...}``, as
flask-limiter's and slowapi's users rename them. ``Retry-After`` keeps its name: it is
HTTP's own field (RFC 9110 §10.2.3), which clients, proxies and HTTP libraries act on.
A mapping that cannot be sent as asked is refused at start (``ConfigurationError``): a
name that is not a field ratekeeper sends, a new name that is not an HTTP field name
(RFC 9110 §5.1, a token), one that HTTP already gives a meaning (``Content-Type``), or two
fields sent under one name (names compare without case, as HTTP's do).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from ratekeeper.config.problems import did_you_mean
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.errors import ConfigurationError
from ratekeeper.limit import Limit
from ratekeeper.web.options import HEADER_NAME

if TYPE_CHECKING:
    from ratekeeper.rule import Rule

__all__ = [
    "DEFAULT_HEADERS",
    "DEFAULT_NAMES",
    "MAX_NAME_LENGTH",
    "MAX_SCALE",
    "HeaderNames",
    "HeaderOptions",
    "advertised",
    "exact_policy",
    "header_names",
    "header_options",
    "one_rule_headers",
    "policy_names",
    "rate_limit_headers",
    "ratelimit_fields",
    "retry_after_seconds",
    "sf_string",
    "whole_seconds",
    "x_ratelimit_fields",
]

_US = 1_000_000
MAX_SCALE = 1000
"""The most windows of a limit that a policy may add up to make whole seconds."""

UNINFORMED = frozenset({"allow", "deny"})
"""The failure policies whose decisions know nothing of the quota."""


class HeaderNames(NamedTuple):
    """The name each rate-limit field is sent under; None leaves that field out.

    Built by ``header_names()``, which checks the names; a tuple, so that a request
    unpacks all five at once (the headers are on every limited request's path)."""

    policy: str | None = "RateLimit-Policy"
    ratelimit: str | None = "RateLimit"
    limit: str | None = "X-RateLimit-Limit"
    remaining: str | None = "X-RateLimit-Remaining"
    reset: str | None = "X-RateLimit-Reset"


DEFAULT_NAMES = HeaderNames()
_FIELDS: tuple[str, ...] = (
    "RateLimit-Policy",
    "RateLimit",
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
)
"""The fields' default names, in ``HeaderNames``' order."""

MAX_NAME_LENGTH = 128
"""The longest name a field may be renamed to (servers cap a header line's length)."""

_RENAMABLE = {name.lower(): i for i, name in enumerate(_FIELDS)}
_RETRY_AFTER = "retry-after"
# Fields whose meaning HTTP fixes (framing, connection, or what a 429 already says): a
# rate-limit field sent under one of these names would change what the response means.
_RESERVED = frozenset(
    {
        _RETRY_AFTER,
        "content-type",
        "content-length",
        "content-encoding",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "trailer",
        "te",
        "host",
        "date",
        "location",
        "set-cookie",
        "vary",
        "cache-control",
    }
)


def header_names(mapping: Mapping[str, str | None] | None) -> HeaderNames:
    """The ``header_names`` option resolved: a mapping from a field's default name
    (``"X-RateLimit-Remaining"``, any case) to the name to send it under, or None to leave
    it out; None is the defaults. Raises ``ConfigurationError`` saying what is wrong and
    what would be right (see the module docstring)."""
    if mapping is None:
        return DEFAULT_NAMES
    if not isinstance(mapping, Mapping):
        raise ConfigurationError(
            "header_names must be a mapping from a field's default name to the name to send it under "
            "(or None to leave it out), e.g. {'X-RateLimit-Limit': 'X-Rate-Limit-Limit'}; "
            f"got a {type(mapping).__name__}"
        )
    names: list[str | None] = list(DEFAULT_NAMES)
    seen: dict[int, str] = {}
    for key, value in mapping.items():
        index = _field_index(key)
        if index in seen:
            raise ConfigurationError(
                f"header_names renames {_FIELDS[index]} twice ({seen[index]!r} and {key!r}; "
                "field names compare without case): keep one entry"
            )
        seen[index] = key
        names[index] = _new_name(_FIELDS[index], value)
    resolved = HeaderNames(*names)
    _check_distinct(resolved)
    return resolved


def _field_index(key: Any) -> int:
    """The index in ``HeaderNames`` of the field ``key`` names (its default name, any case)."""
    renamable = ", ".join(_FIELDS)
    if not isinstance(key, str):
        raise ConfigurationError(f"header_names: a key is a field's default name ({renamable}), not {key!r}")
    folded = key.lower()
    if folded == _RETRY_AFTER:
        raise ConfigurationError(
            "header_names cannot rename or leave out Retry-After: it is HTTP's own field (RFC 9110 §10.2.3), "
            "which clients, proxies and HTTP libraries act on to wait before retrying; "
            f"the fields that can be renamed are {renamable}"
        )
    index = _RENAMABLE.get(folded)
    if index is None:
        hint = did_you_mean(key, _FIELDS)
        raise ConfigurationError(
            f"header_names: {key!r} is not a field ratekeeper sends{hint}; the fields that can be renamed are "
            f"{renamable}"
        )
    return index


def _new_name(field: str, value: Any) -> str | None:
    """``value`` checked as the name to send ``field`` under (None: leave it out)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigurationError(
            f"header_names: {field} maps to {value!r}; give a str (the name to send it under) or None to leave it out"
        )
    if len(value) > MAX_NAME_LENGTH or HEADER_NAME.fullmatch(value) is None:
        shown = value if len(value) <= MAX_NAME_LENGTH else value[:MAX_NAME_LENGTH] + "..."
        raise ConfigurationError(
            f"header_names: {shown!r} (for {field}) is not an HTTP field name: it must be 1 to {MAX_NAME_LENGTH} "
            "letters, digits or !#$%&'*+-.^_`|~ (RFC 9110 §5.1: no spaces, colons or other separators), "
            "e.g. 'X-Rate-Limit-Limit'"
        )
    if value.lower() in _RESERVED:
        raise ConfigurationError(
            f"header_names: {field} cannot be sent as {value!r}: HTTP already gives that field a meaning; "
            f"choose a name of your own, e.g. 'X-Rate-Limit-{field.rsplit('-', 1)[-1]}'"
        )
    return value


def _check_distinct(names: HeaderNames) -> None:
    """No two fields sent under one name (field names compare without case, RFC 9110 §5.1)."""
    owner: dict[str, int] = {}
    for i, name in enumerate(names):
        if name is None:
            continue
        other = owner.setdefault(name.lower(), i)
        if other != i:
            first, second = _FIELDS[other], _FIELDS[i]
            raise ConfigurationError(
                f"header_names: {first} and {second} would both be sent as {name!r} "
                f"(as {names[other]!r} and {name!r}; field names compare without case): give each its own name, "
                "or map one to None to leave it out"
            )


def _sent(names: HeaderNames) -> tuple[str, str, str, str, str]:
    """``names`` with ``""`` for a field left out."""
    policy, ratelimit, limit, remaining, reset = (name or "" for name in names)
    return policy, ratelimit, limit, remaining, reset


def _present(fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``fields`` without those left out (built under ``""``)."""
    return [f for f in fields if f[0]]


@dataclass(frozen=True, slots=True)
class HeaderOptions:
    """Which headers to send, how ``X-RateLimit-Reset`` counts, and the names the fields
    are sent under (see the module docstring)."""

    ratelimit: bool = True
    x_ratelimit: bool = True
    reset: Literal["seconds", "epoch"] = "seconds"
    names: HeaderNames = DEFAULT_NAMES
    sent: tuple[str, str, str, str, str] = field(init=False, repr=False, compare=False)
    """``names`` with ``""`` for a field left out: what a request builds its fields with."""
    partial: bool = field(init=False, repr=False, compare=False)
    """Whether a field is left out: then the built fields named ``""`` are dropped."""

    def __post_init__(self) -> None:
        if self.reset not in ("seconds", "epoch"):
            raise ValueError(
                f"x_ratelimit_reset must be 'seconds' (seconds from now) or 'epoch' (Unix time), got {self.reset!r}"
            )
        if self.names is not DEFAULT_NAMES:  # built in code, not by header_names(): checked all the same
            header_names(dict(zip(_FIELDS, self.names, strict=True)))
        object.__setattr__(self, "sent", _sent(self.names))
        object.__setattr__(self, "partial", None in self.names)


DEFAULT_HEADERS = HeaderOptions()


def header_options(options: Mapping[str, Any]) -> HeaderOptions:
    """The ``HeaderOptions`` of the web core's options (``ratelimit_headers``,
    ``x_ratelimit_headers``, ``x_ratelimit_reset``, ``header_names``); a value that cannot
    be used is a ``ConfigurationError``."""
    try:
        return HeaderOptions(
            options.get("ratelimit_headers", True),
            options.get("x_ratelimit_headers", True),
            options.get("x_ratelimit_reset", "seconds"),
            header_names(options.get("header_names")),
        )
    except ValueError as exc:  # x_ratelimit_reset's
        raise ConfigurationError(str(exc)) from None


def whole_seconds(us: int) -> int:
    """Microseconds as whole seconds, rounded up (never negative)."""
    return max(0, -(-us // _US))


def sf_string(text: str) -> str:
    """``text`` as a structured-field String (RFC 8941 §3.3.3): quoted, escaped, printable ASCII."""
    safe = "".join(ch if " " <= ch <= "~" else "?" for ch in text)
    return '"' + safe.replace("\\", "\\\\").replace('"', '\\"') + '"'


def policy_names(rule: str, limits: Sequence[Limit]) -> list[str]:
    """The policy name of each limit of ``rule`` (see the module docstring)."""
    if len(limits) == 1:
        return [rule]
    windows = [_window(limit) for limit in limits]
    return [f"{rule}.{w}" if windows.count(w) == 1 else f"{rule}.{w}.{i}" for i, w in enumerate(windows)]


def _window(limit: Limit) -> str:
    us = limit.period_us
    return f"{us // _US}s" if us % _US == 0 else f"{us // 1000}ms" if us % 1000 == 0 else f"{us}us"


def exact_policy(limit: Limit) -> tuple[int, int] | None:
    """``(q, w)``: ``limit`` as a quota over whole seconds, exactly; None when none is.

    The shortest whole-second window that holds a whole number ``k`` of the limit's
    windows, with ``k`` times its count (``10/100ms`` -> ``(100, 1)``)."""
    k = _US // math.gcd(limit.period_us, _US)
    if k > MAX_SCALE:
        return None
    return limit.count * k, limit.period_us * k // _US


def _limit_t(decision: Decision, i: int) -> int:
    """``t`` of limit ``i``: seconds until it admits more (see the module docstring)."""
    if i == decision.denied_index:
        if decision.retry_us != INFINITE:
            return max(1, whole_seconds(decision.retry_us))
        # Never admissible: nothing comes back for this cost; say when the window is whole.
        return max(1, whole_seconds(decision.reset_us[i] or decision.rule_limits[i].period_us))
    return whole_seconds(decision.reset_us[i])


def _limit_r(decision: Decision, i: int) -> int:
    if i == decision.denied_index and decision.retry_us == INFINITE:
        return 0
    return max(0, decision.remaining_each[i])


@lru_cache(maxsize=1024)
def _policy(rule: str, limits: tuple[Limit, ...]) -> tuple[tuple[tuple[int, str], ...], str]:
    """(the index and sf-String name of each advertised limit, the rule's ``RateLimit-Policy``
    members).

    Cached: both depend only on the rule's name and limits (bounded by the configuration,
    and by ``maxsize`` for per-key quotas), and building them is most of a header's cost.
    """
    names = policy_names(rule, limits)
    items: list[tuple[int, str]] = []
    members: list[str] = []
    for i, limit in enumerate(limits):
        exact = exact_policy(limit)
        if exact is None:
            continue
        item = sf_string(names[i])
        items.append((i, item))
        members.append(f"{item};q={exact[0]};w={exact[1]}")
    return tuple(items), ", ".join(members)


def ratelimit_fields(decisions: Iterable[Decision], names: HeaderNames = DEFAULT_NAMES) -> list[tuple[str, str]]:
    """``RateLimit-Policy`` and ``RateLimit`` for the advertised decisions of one request,
    under ``names``."""
    sent = _sent(names)
    return _present(_ratelimit_fields(decisions, sent[0], sent[1]))


def _ratelimit_fields(decisions: Iterable[Decision], policy_name: str, ratelimit_name: str) -> list[tuple[str, str]]:
    """``ratelimit_fields``, a field left out built under ``""`` (see ``HeaderOptions.sent``).

    One member per policy: when several decisions of a request share a rule and limits
    (a batch checking several keys of one rule), the field names the policy once and
    reports its tightest state (least remaining, then longest wait), so a client reading
    one item per policy reads the one that binds.
    """
    policy: dict[str, None] = {}
    state: dict[str, tuple[int, int]] = {}
    for d in decisions:
        limits = d.rule_limits
        if not limits:
            continue  # a key that no limit applies to: nothing to advertise
        items, members = _rule_policy(d.rule, limits)
        if not items:
            continue
        policy[members] = None
        for i, item in items:
            r, t = _limit_r(d, i), _limit_t(d, i)
            seen = state.get(item)
            if seen is None or r < seen[0] or (r == seen[0] and t > seen[1]):
                state[item] = (r, t)
    if not policy:
        return []
    return [
        (policy_name, ", ".join(policy)),
        (ratelimit_name, ", ".join([f"{item};r={r};t={t}" for item, (r, t) in state.items()])),
    ]


_last_policy: list[tuple[str, tuple[Limit, ...], tuple[tuple[tuple[int, str], ...], str]]] = []


def _rule_policy(rule: str, limits: tuple[Limit, ...]) -> tuple[tuple[tuple[int, str], ...], str]:
    """``_policy(rule, limits)``, the last answer kept by the limits' identity: the
    decisions of a rule share its tuple of limits, and hashing it costs more than the lookup."""
    for last in _last_policy:  # none or one
        if last[1] is limits and last[0] == rule:
            return last[2]
    found = _policy(rule, limits)
    _last_policy[:] = [(rule, limits, found)]
    return found


def _reported(decisions: Sequence[Decision]) -> tuple[Decision, int] | None:
    """The decision and limit index that ``X-RateLimit-*`` report."""
    denied = [d for d in decisions if not d.allowed and d.rule_limits and d.denied_index >= 0]
    if denied:
        d = max(denied, key=lambda d: float("inf") if d.retry_us == INFINITE else d.retry_us)
        return d, d.denied_index
    best: tuple[Decision, int] | None = None
    for d in decisions:
        for i in range(len(d.rule_limits)):
            if best is None:
                best = (d, i)
                continue
            bd, bi = best
            if (d.remaining_each[i], -d.reset_us[i]) < (bd.remaining_each[bi], -bd.reset_us[bi]):
                best = (d, i)
    return best


def x_ratelimit_fields(
    decisions: Sequence[Decision],
    reset: str = "seconds",
    now: Callable[[], float] = time.time,
    names: HeaderNames = DEFAULT_NAMES,
) -> list[tuple[str, str]]:
    """``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset`` for the advertised decisions,
    under ``names``; ``reset``: ``"seconds"`` from now or ``"epoch"`` (Unix time, ``now()``
    the clock)."""
    return _present(_x_ratelimit_fields(decisions, reset, now, _sent(names)))


def _x_ratelimit_fields(
    decisions: Sequence[Decision], reset: str, now: Callable[[], float], sent: tuple[str, ...]
) -> list[tuple[str, str]]:
    """``x_ratelimit_fields``, a field left out built under ``""`` (see ``HeaderOptions.sent``)."""
    reported = _reported(decisions)
    if reported is None:
        return []
    d, i = reported
    t = _limit_t(d, i)
    value = t if reset == "seconds" else math.ceil(now()) + t
    return [(sent[2], str(d.rule_limits[i].count)), (sent[3], str(_limit_r(d, i))), (sent[4], str(value))]


def _one_limit_fields(d: Decision, options: HeaderOptions, now: Callable[[], float]) -> list[tuple[str, str]]:
    """``ratelimit_fields([d])`` and ``x_ratelimit_fields([d], ...)`` for a decision of a
    rule of one limit, as most requests have: both report that limit, with the same
    remaining count and seconds, so each is worked out once."""
    if d.denied_index == 0:  # the limit refused: ``_limit_r`` and ``_limit_t`` of it, inlined
        retry_us = d.retry_us
        if retry_us != INFINITE:
            r = d.remaining_each[0]
            r = r if r > 0 else 0
            t = -(-retry_us // _US)  # ``max(1, whole_seconds(...))``
        else:  # never admissible: say when the window is whole
            r = 0
            t = -(-(d.reset_us[0] or d.rule_limits[0].period_us) // _US)
        t = t if t > 1 else 1
    else:  # the same, inlined for the limit that did not refuse (every admitted request)
        r = d.remaining_each[0]
        r = r if r > 0 else 0
        t = -(-d.reset_us[0] // _US)  # ``whole_seconds``
        t = t if t > 0 else 0
    policy_name, ratelimit_name, limit_name, remaining_name, reset_name = options.sent
    if options.x_ratelimit:
        reset = t if options.reset == "seconds" else math.ceil(now()) + t
        x_fields = [(limit_name, str(d.rule_limits[0].count)), (remaining_name, str(r)), (reset_name, str(reset))]
    else:
        x_fields = []
    if options.ratelimit:
        items, members = _rule_policy(d.rule, d.rule_limits)
        if items:
            return [(policy_name, members), (ratelimit_name, f"{items[0][1]};r={r};t={t}"), *x_fields]
    return x_fields


def retry_after_seconds(decisions: Iterable[Decision]) -> int | None:
    """Whole seconds (at least 1) until every refusing decision admits; None when never."""
    worst = 0
    for d in decisions:
        if d.allowed:
            continue
        if d.retry_us == INFINITE:
            return None
        worst = max(worst, d.retry_us)
    return max(1, whole_seconds(worst))


def advertised(enforced: Iterable[tuple[Rule, Decision]]) -> list[Decision]:
    """The decisions that quota headers may describe: not a concurrency rule's, not one
    the failure policy made up while the store was unreachable."""
    return [d for rule, d in enforced if rule.algorithm != "concurrency" and d.fallback not in UNINFORMED]


def rate_limit_headers(
    enforced: Iterable[tuple[Rule, Decision]],
    *,
    allowed: bool,
    options: HeaderOptions = DEFAULT_HEADERS,
    now: Callable[[], float] = time.time,
) -> list[tuple[str, str]]:
    """Every rate-limit header of one request's answer, from its enforced rules and their
    decisions (shadow rules are never in headers): the quota fields of the advertised
    decisions (``advertised``) and, when the request was refused, ``Retry-After``."""
    pairs = list(enforced)
    headers = _quota_fields(advertised(pairs), options, now)
    if not allowed:
        retry = retry_after_seconds(d for _, d in pairs)
        if retry is not None:
            headers.append(("Retry-After", str(retry)))
    return headers


def one_rule_headers(
    rule: Rule,
    decision: Decision,
    *,
    allowed: bool,
    options: HeaderOptions = DEFAULT_HEADERS,
    now: Callable[[], float] = time.time,
) -> list[tuple[str, str]]:
    """``rate_limit_headers([(rule, decision)], ...)``: the headers of a request that one
    enforced rule decided, as most requests are, without building the lists of pairs."""
    if rule.algorithm == "concurrency" or decision.fallback in UNINFORMED:
        headers = []  # nothing advertised (``advertised``)
    elif len(decision.rule_limits) == 1:  # ``_quota_fields`` of one limit, one call less
        headers = _one_limit_fields(decision, options, now)
        if options.partial:
            headers = _present(headers)
    else:
        headers = _quota_fields((decision,), options, now)
    if not allowed:  # ``retry_after_seconds((decision,))``, inlined
        us = 0 if decision.allowed else decision.retry_us
        if us != INFINITE:
            us = -(-us // _US)
            headers.append(("Retry-After", str(us if us > 1 else 1)))
    return headers


def _quota_fields(shown: Sequence[Decision], options: HeaderOptions, now: Callable[[], float]) -> list[tuple[str, str]]:
    """The quota fields of the advertised decisions ``shown``, under ``options``' names."""
    headers: list[tuple[str, str]]
    if len(shown) == 1 and len(shown[0].rule_limits) == 1:
        headers = _one_limit_fields(shown[0], options, now)
    else:
        headers = []
        sent = options.sent
        if options.ratelimit:
            headers += _ratelimit_fields(shown, sent[0], sent[1])
        if options.x_ratelimit:
            headers += _x_ratelimit_fields(shown, options.reset, now, sent)
    if options.partial:  # a field left out was built under "": cheaper than a test per field
        headers = _present(headers)
    return headers
