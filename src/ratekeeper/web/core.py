"""The request-to-decision core that every HTTP integration shares (ASGI, WSGI, Django, FastAPI).

API (stable; integrations build on it)::

    core = RateLimitCore(rules=..., store="memory://", asynchronous=True, **options)
    view = RequestView(method="GET", path="/items/alice", host="api.example",
                       headers={"x-api-key": "k1"}, query_string="a=1", peer="10.0.0.7",
                       user=None, route=None, path_params={}, native=scope)
    verdict = await core.check_async(view)         # or core.check_sync(view) (asynchronous=False)
    if not verdict.allowed:
        send(verdict.status, verdict.headers, verdict.body)   # the 429 (or deny_response's)
    else:
        ... call the app, add verdict.headers to its response ...
        await core.finish_async(verdict, status)   # or core.finish_sync: refunds, lease releases

``verdict.headers`` is a list of ``(name, value)`` str pairs: on a pass, the rate-limit
headers to add to the app's response (empty when no enforced rule applied); on a denial,
every header of the 429 including ``Content-Type`` and ``Retry-After``. ``finish_*`` must be
called once per allowed verdict after the app answered (with 500 when the app raised); it
does nothing for exempt or unlimited requests.

Options (the same names in every integration):

- ``rules``: a path to a native-form rules file (checked for changes every
  ``reload_interval`` seconds, 1.0; a file that fails validation is refused and the old
  rules stay), a ``RuleSet``, or a list of ``HttpRule`` / ``Rule`` (a bare ``Rule``
  applies to every request, with one global key): ``ratekeeper.config.rules_from``.
- ``store`` (URL or store object; default ``memory://``) or ``limiter`` (a ``Limiter`` for
  sync integrations, an ``AsyncLimiter`` for async ones). ``on_error`` is the limiter's
  failure policy for rules without their own (default ``"allow"``: a web site stays up
  when its store is down; a rule's ``on_error: deny`` keeps e.g. login closed).
- ``trusted_proxies`` (networks of the proxies in front of the app), ``forwarded_header``
  (the one header they set: ``"x-forwarded-for"``, the default, or ``"forwarded"``),
  ``trusted_hops`` (how many of them append to it, 1), ``ipv6_prefix`` (64): see
  ``ratekeeper.web.client_ip``.
- ``exempt_paths`` (path templates, ``/static/*``), ``exempt_methods``, ``exempt_keys``
  (a mapping: a rule name to the keys of that rule that it does not limit, or a key
  template such as ``"{client_ip}"`` to the values that exempt a request from every
  rule), ``exempt_networks`` (client addresses), ``exempt`` (``callable(view) -> bool``).
- ``user``: ``callable(view) -> str | None``, the ``{user}`` part (default: what the
  integration found, e.g. ``REMOTE_USER`` or Starlette's ``scope["user"]``).
- ``key``: ``callable(view, http_rule) -> str | None`` building every rule's key instead
  of its template (None: the request lacks it, the rule is skipped).
- ``cost``: an int for every rule, a key template (``"{header.x-cost}"``), a
  ``callable(view, http_rule) -> int | None`` (None: the rule's own cost), or a mapping of
  rule name to any of those (a callable there takes ``view`` only).
- ``refund_statuses``: response statuses (e.g. ``range(500, 600)``) whose charges are given back.
- ``shadow``: True (every rule) or rule names: decided but never refusing, never in
  headers; charged only when the request is admitted (``ratekeeper.limiter.transaction``).
- ``ratelimit_headers`` / ``x_ratelimit_headers`` (True): the two header families;
  ``x_ratelimit_reset``: ``"seconds"`` (from now, the default) or ``"epoch"`` (Unix
  time) for ``X-RateLimit-Reset`` (``ratekeeper.web.headers``).
- ``deny_response``: ``callable(denied_decisions) -> (status, headers, body)`` replacing
  the 429 (the rate-limit headers are still added unless switched off). Header names and
  values may be ``str`` or ``bytes``; an answer that is not a valid response (a status
  outside 100-599, a header with a line break) is logged and the standard 429 sent.
- ``metrics``: a ``ratekeeper.metrics.Metrics`` (the limiter's observer; told skipped
  rules, shadow rules and reloads here, and each request by the integration:
  ``metrics.request("asgi")``).

How one request is decided: the rules whose ``match`` fits, in order; each renders its key
(a rule whose key cannot be built from the request is skipped and counted, never an error
page; a key longer than a store accepts is bounded by ``ratekeeper.keys.bounded_key``; a
cost template the request does not fill with ASCII digits charges ``MISSING_COST``, 1, so
leaving the header out never dodges a rule); a rule's exempt key leaves that rule out;
then the request's transaction (``ratekeeper.limiter.transaction``, the same as the
service's): ONE all-or-nothing ``try_acquire_many`` for the enforced rules, and the shadow
rules charged only when that admitted the request; a refused request charges nothing.
The logic is written once as a generator (``check_flow``) that yields the calls to make;
``check_sync`` / ``check_async`` only run them (the shape of ``ratekeeper.limiter.flows``).

A request refused because the store is unreachable and a rule fails closed (``on_error:
deny``) is answered 503 ``limiter-unavailable`` (``ratekeeper.web.problem``), not 429.

Several checks of one request (the middleware, then a FastAPI dependency of the route)
share a ``RequestLedger`` (``LEDGER``, in the ASGI scope): the response carries one set of
rate-limit headers, for every rule that admitted it, written by the outermost check; and
when an inner check refuses, what the outer ones charged is given back, so a refusal
charges nothing anywhere.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Collection, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Protocol
from urllib.parse import parse_qsl

from ratekeeper.config.model import HttpRule, KeyTemplate, PathTemplate, RuleSet
from ratekeeper.config.native import load_rules
from ratekeeper.config.sources import rules_from
from ratekeeper.config.watcher import RulesWatcher
from ratekeeper.decision import BatchDecision, Decision
from ratekeeper.errors import ConfigurationError
from ratekeeper.keys import bounded_key
from ratekeeper.limit import MAX_COUNT
from ratekeeper.limiter.limiter import Limiter
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.limiter.transaction import Entry, Outcome, Step, drive_async, drive_sync, transaction
from ratekeeper.rule import Rule
from ratekeeper.web.client_ip import ClientAddress, Networks
from ratekeeper.web.headers import HeaderOptions, rate_limit_headers, retry_after_seconds
from ratekeeper.web.problem import (
    LIMITER_UNAVAILABLE_STATUS,
    PROBLEM_CONTENT_TYPE,
    problem_body,
    unavailable_body,
)

__all__ = [
    "LEDGER",
    "Charge",
    "CheckFlow",
    "DenyResponse",
    "RateLimitCore",
    "RequestLedger",
    "RequestView",
    "Verdict",
    "WebMetrics",
]

CheckFlow = Generator[Step, Sequence[BatchDecision | Decision], "Verdict"]
"""Yields the calls of the request's transaction (``ratekeeper.limiter.transaction``);
receives their answers; returns the verdict."""

DenyResponse = Callable[[Sequence[Decision]], tuple[int, Iterable[tuple[str | bytes, str | bytes]], bytes | str]]

log = logging.getLogger("ratekeeper.web")


class WebMetrics(Protocol):
    """What the core tells a metrics object besides the limiter's observations; also
    ``configured_rules(names, source)`` when it has one (``Metrics`` does): the rules that
    get a label of their own."""

    def shadow_rules(self, names: Iterable[str]) -> None: ...
    def skipped(self, rule: str) -> None: ...
    def reloaded(self, ok: bool) -> None: ...
    def request(self, transport: str) -> None: ...


@dataclass(slots=True)
class RequestView:
    """One request, as every integration describes it to the core.

    ``headers`` has lower-case names; a field sent several times is one value joined with
    ``", "``. ``peer`` is the TCP peer's address (no port), None when unknown (a Unix
    socket). ``user`` is the authenticated user's id, or a callable giving it (called at
    most once, only when a rule needs ``{user}``). ``route`` is the route template that
    matched (``/items/{user}``) when the framework knows it before the app runs;
    ``path_params`` the framework's own path parameters (a rule's own path template wins).
    ``native`` is the framework's request object (ASGI scope, WSGI environ, HttpRequest),
    for the option callables.
    """

    method: str
    path: str
    host: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    query_string: str = ""
    peer: str | None = None
    user: str | Callable[[], str | None] | None = None
    route: str | Callable[[], str | None] | None = None
    path_params: Mapping[str, str] | Callable[[], Mapping[str, str]] = field(default_factory=dict)
    native: Any = None
    _query: dict[str, str] | None = field(default=None, repr=False)

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def query(self, name: str) -> str | None:
        """The first value of query parameter ``name``."""
        if self._query is None:
            parsed: dict[str, str] = {}
            for k, v in parse_qsl(self.query_string, keep_blank_values=True):
                parsed.setdefault(k, v)
            self._query = parsed
        return self._query.get(name)

    def resolved_user(self) -> str | None:
        if callable(self.user):
            self.user = self.user()
        return self.user

    def resolved_route(self) -> str | None:
        if callable(self.route):
            self.route = self.route()
        return self.route

    def resolved_path_params(self) -> Mapping[str, str]:
        if callable(self.path_params):
            self.path_params = self.path_params()
        return self.path_params


@dataclass(frozen=True, slots=True)
class Charge:
    """What one request charged to one rule, to give back or release after the response."""

    rule: Rule
    key: str
    cost: int
    lease_id: str | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer for one request: pass (``headers`` to add) or deny (a whole 429)."""

    allowed: bool
    headers: tuple[tuple[str, str], ...] = ()
    status: int = 200
    body: bytes = b""
    decisions: tuple[Decision, ...] = ()
    shadow: tuple[Decision, ...] = ()
    charges: tuple[Charge, ...] = ()
    skipped: tuple[str, ...] = ()
    exempt: bool = False
    rules: tuple[Rule, ...] = ()  # the rule of each of ``decisions``

    @property
    def enforced(self) -> tuple[tuple[Rule, Decision], ...]:
        """(rule, decision) of every enforced rule, what the headers describe."""
        return tuple(zip(self.rules, self.decisions, strict=True))

    @property
    def denied(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if not d.allowed)


PASS = Verdict(True)
EXEMPT = Verdict(True, exempt=True)


@dataclass(frozen=True, slots=True)
class _Prepared:
    enforced: tuple[tuple[HttpRule, str, int], ...]
    shadow: tuple[tuple[HttpRule, str, int], ...]
    skipped: tuple[str, ...]


CostOption = int | str | KeyTemplate | Callable[..., int | None]


class RateLimitCore:
    """Decides requests for one integration instance (see the module docstring)."""

    def __init__(
        self,
        rules: Any,
        *,
        store: Any = "memory://",
        limiter: Limiter | AsyncLimiter | None = None,
        asynchronous: bool,
        on_error: str = "allow",
        trusted_proxies: Iterable[str] | str | None = None,
        forwarded_header: str = "x-forwarded-for",
        trusted_hops: int = 1,
        ipv6_prefix: int = 64,
        exempt_paths: Iterable[str] = (),
        exempt_methods: Iterable[str] = (),
        exempt_keys: Mapping[str, Iterable[str] | str] | Iterable[str] = (),
        exempt_networks: Iterable[str] | str | None = None,
        exempt: Callable[[RequestView], bool] | None = None,
        user: Callable[[RequestView], str | None] | None = None,
        key: Callable[[RequestView, HttpRule], str | None] | None = None,
        cost: CostOption | Mapping[str, CostOption] | None = None,
        refund_statuses: Collection[int] = (),
        shadow: bool | Iterable[str] = False,
        ratelimit_headers: bool = True,
        x_ratelimit_headers: bool = True,
        x_ratelimit_reset: str = "seconds",
        deny_response: DenyResponse | None = None,
        metrics: Any = None,
        reload_interval: float = 1.0,
    ) -> None:
        try:
            self.header_options = HeaderOptions(ratelimit_headers, x_ratelimit_headers, x_ratelimit_reset)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        self.asynchronous = asynchronous
        self.metrics = metrics
        # Optional on a metrics object (``Metrics`` has it): looked up once, not per request.
        self._decision_time: Callable[[float, bool], None] | None = getattr(metrics, "decision_time", None)
        self.owns_limiter = limiter is None  # close only a limiter made here
        if limiter is None:
            kind = AsyncLimiter if asynchronous else Limiter
            limiter = kind(store, on_error=on_error, observer=metrics)
        elif asynchronous and not isinstance(limiter, AsyncLimiter):
            raise ConfigurationError("this integration is asynchronous: pass an AsyncLimiter as limiter=")
        elif not asynchronous and not isinstance(limiter, Limiter):
            raise ConfigurationError("this integration is synchronous: pass a Limiter as limiter=")
        self.limiter = limiter
        self.client = ClientAddress(
            Networks(trusted_proxies, what="trusted_proxies"), ipv6_prefix, forwarded_header, trusted_hops
        )
        self.exempt_paths = tuple(PathTemplate.parse(p) for p in _strings(exempt_paths, "exempt_paths"))
        self.exempt_methods = frozenset(m.upper() for m in _strings(exempt_methods, "exempt_methods"))
        self.exempt_keys, self.exempt_parts = _exempt_keys(exempt_keys)
        self.exempt_networks = Networks(exempt_networks, what="exempt_networks")
        self.exempt = exempt
        self.user = user
        self.key = key
        self.cost = _cost_option(cost)
        self.refund_statuses = frozenset(refund_statuses)
        self.shadow_all = shadow is True
        self.shadow_names = frozenset() if isinstance(shadow, bool) else frozenset(_strings(shadow, "shadow"))
        self.ratelimit_headers = ratelimit_headers
        self.x_ratelimit_headers = x_ratelimit_headers
        self.deny_response = deny_response
        self._source = _RulesSource(rules, metrics, reload_interval)
        self._reported: RuleSet | None = None
        self._report_rules(self._source.current())
        unknown = set(self.exempt_keys) - {r.name for r in self._source.current()}
        if unknown:
            log.warning("ratekeeper: exempt_keys names rules that are not in the rules: %s", ", ".join(sorted(unknown)))

    # -- the rules ------------------------------------------------------------------

    @property
    def rules(self) -> RuleSet:
        """The rules in force (the latest valid version of a rules file)."""
        ruleset = self._source.current()
        if ruleset is not self._reported:
            self._report_rules(ruleset)
        return ruleset

    def _is_shadow(self, rule: HttpRule) -> bool:
        return self.shadow_all or rule.shadow or rule.name in self.shadow_names

    def _report_rules(self, ruleset: RuleSet) -> None:
        """Tell the metrics which rules are in force (only they get a label of their own)
        and which of them are in shadow mode."""
        self._reported = ruleset
        if self.metrics is None:
            return
        configured = getattr(self.metrics, "configured_rules", None)  # optional: older metrics objects lack it
        if configured is not None:
            configured([r.name for r in ruleset], source=f"web-{id(self)}")
        self.metrics.shadow_rules(sorted(r.name for r in ruleset if self._is_shadow(r)))

    # -- one request ----------------------------------------------------------------

    def check_flow(self, view: RequestView) -> CheckFlow:
        """The decision for ``view`` as a flow (see ``CheckFlow``)."""
        prepared = self._prepare(view)
        if prepared is None:
            return EXEMPT
        if not prepared.enforced and not prepared.shadow:
            return Verdict(True, skipped=prepared.skipped) if prepared.skipped else PASS
        entries = [Entry(r.rule, key, cost) for r, key, cost in prepared.enforced]
        entries += [Entry(r.rule, key, cost, shadow=True) for r, key, cost in prepared.shadow]
        outcome = yield from transaction(entries)
        return self._verdict(prepared, outcome)

    def check_sync(self, view: RequestView) -> Verdict:
        """Decide ``view`` with the blocking ``Limiter``."""
        limiter = self.limiter
        assert isinstance(limiter, Limiter), "check_sync needs asynchronous=False"
        start = perf_counter()
        verdict = drive_sync(limiter, self.check_flow(view))
        self._timed(start, verdict)
        return verdict

    async def check_async(self, view: RequestView) -> Verdict:
        """Decide ``view`` with the ``AsyncLimiter``; the calls of one step run concurrently."""
        limiter = self.limiter
        assert isinstance(limiter, AsyncLimiter), "check_async needs asynchronous=True"
        start = perf_counter()
        verdict = await drive_async(limiter, self.check_flow(view))
        self._timed(start, verdict)
        return verdict

    def _timed(self, start: float, verdict: Verdict) -> None:
        """Report the decision's time to the metrics (``decision_time``, optional like
        ``configured_rules``); a request no rule limited never reached the limiter."""
        timed = self._decision_time
        if timed is not None and verdict is not EXEMPT and verdict is not PASS:
            timed(perf_counter() - start, verdict.allowed)

    def headers_for(self, verdicts: Sequence[Verdict]) -> list[tuple[str, str]]:
        """One set of rate-limit headers for a request admitted by several checks (the
        middleware's and a dependency's): every enforced rule of them, the tightest first."""
        enforced = [pair for v in verdicts for pair in v.enforced]
        return rate_limit_headers(enforced, allowed=True, options=self.header_options)

    async def undo_async(self, verdict: Verdict) -> None:
        """Give back everything ``verdict`` charged (the request was refused further in)."""
        limiter = self.limiter
        assert isinstance(limiter, AsyncLimiter), "undo_async needs asynchronous=True"
        for c in verdict.charges:
            await limiter.refund(c.rule, c.key, c.cost, lease_id=c.lease_id)

    def releases(self, verdict: Verdict, status: int) -> list[Charge]:
        """What to give back once the app answered ``status``: every charge when the status
        is in ``refund_statuses``, else only the concurrency leases (held for the request)."""
        if status in self.refund_statuses:
            return list(verdict.charges)
        return [c for c in verdict.charges if c.lease_id is not None]

    def finish_sync(self, verdict: Verdict, status: int) -> None:
        limiter = self.limiter
        assert isinstance(limiter, Limiter), "finish_sync needs asynchronous=False"
        for c in self.releases(verdict, status):
            limiter.refund(c.rule, c.key, c.cost, lease_id=c.lease_id)

    async def finish_async(self, verdict: Verdict, status: int) -> None:
        limiter = self.limiter
        assert isinstance(limiter, AsyncLimiter), "finish_async needs asynchronous=True"
        for c in self.releases(verdict, status):
            await limiter.refund(c.rule, c.key, c.cost, lease_id=c.lease_id)

    def close_sync(self) -> None:
        """Close the store of a limiter made from ``store=`` (one given as ``limiter=`` is the caller's)."""
        limiter = self.limiter
        if self.owns_limiter and isinstance(limiter, Limiter):
            limiter.close()

    async def aclose(self) -> None:
        """Close the store of a limiter made from ``store=`` (one given as ``limiter=`` is the caller's)."""
        limiter = self.limiter
        if self.owns_limiter and isinstance(limiter, AsyncLimiter):
            await limiter.aclose()

    # -- the pure parts ---------------------------------------------------------------

    def _prepare(self, view: RequestView) -> _Prepared | None:
        """The rules, keys and costs for ``view``; None when the request is exempt."""
        method = view.method.upper()
        if method in self.exempt_methods:
            return None
        if any(t.match(view.path) is not None for t in self.exempt_paths):
            return None
        lookup = _Lookup(self, view)
        if self.exempt_networks and lookup.client_address() in self.exempt_networks:
            return None
        if self.exempt is not None and self.exempt(view):
            return None
        for template, values in self.exempt_parts:
            if template.render(lookup) in values:
                return None
        enforced: list[tuple[HttpRule, str, int]] = []
        shadow: list[tuple[HttpRule, str, int]] = []
        skipped: list[str] = []
        exempted = False
        for rule in self.rules:
            params = rule.match.match(method, view.path, view.host)
            if params is None:
                continue
            lookup.rule_params = params
            key = rule.key.render(lookup) if self.key is None else self.key(view, rule)
            cost = None if key is None else self._cost(rule, view, lookup)
            if key is None or cost is None:
                skipped.append(rule.name)
                if self.metrics is not None:
                    self.metrics.skipped(rule.name)
                continue
            exempt_keys = self.exempt_keys.get(rule.name)
            if exempt_keys is not None and key in exempt_keys:
                exempted = True
                continue
            (shadow if self._is_shadow(rule) else enforced).append((rule, bounded_key(key), cost))
        if exempted and not enforced and not shadow:
            return None
        return _Prepared(tuple(enforced), tuple(shadow), tuple(skipped))

    def _cost(self, rule: HttpRule, view: RequestView, lookup: _Lookup) -> int | None:
        """The rule's cost for this request; None when it cannot be read from it."""
        option: Any = self.cost
        if isinstance(option, Mapping):
            option = option.get(rule.name)
            if callable(option) and not isinstance(option, KeyTemplate):
                return _as_cost(option(view))
        elif callable(option) and not isinstance(option, KeyTemplate):
            value = option(view, rule)
            if value is not None:
                return _as_cost(value)
            option = None
        chosen = rule.cost if option is None else option
        if isinstance(chosen, KeyTemplate):
            # A cost the request does not state (or states wrongly) is charged as 1: skipping
            # the rule would let a client dodge it by leaving the header out.
            cost = _as_cost(chosen.render(lookup))
            return MISSING_COST if cost is None else cost
        return _as_cost(chosen)

    def _verdict(self, prepared: _Prepared, outcome: Outcome) -> Verdict:
        n = len(prepared.enforced)
        decisions = outcome.decisions[:n]
        shadow = outcome.decisions[n:]
        rules = tuple(entry.rule for entry in outcome.entries[:n])
        charges = tuple(Charge(e.rule, e.key, e.cost, d.lease_id) for e, d in outcome.charged)
        allowed = outcome.allowed
        headers = rate_limit_headers(
            [(e.rule, d) for e, d in outcome.enforced], allowed=allowed, options=self.header_options
        )
        if allowed:
            return Verdict(True, tuple(headers), 200, b"", decisions, shadow, charges, prepared.skipped, rules=rules)
        denied = tuple(d for d in decisions if not d.allowed)
        custom = None if self.deny_response is None else _custom_denial(self.deny_response, denied)
        if custom is not None:
            status, extra, data = custom
            # the caller's answer says itself when to retry (or not)
            headers = [h for h in headers if h[0] != "Retry-After"] + extra
        else:
            headers.append(("Content-Type", PROBLEM_CONTENT_TYPE))
            retry = retry_after_seconds(denied)
            if any(d.fallback == "deny" for d in denied):
                status, data = LIMITER_UNAVAILABLE_STATUS, unavailable_body(denied, retry)
            else:
                status, data = 429, problem_body(denied, retry)
        return Verdict(False, tuple(headers), status, data, decisions, shadow, charges, prepared.skipped, rules=rules)

    def needs_finish(self, verdict: Verdict) -> bool:
        """Whether ``finish_*`` has anything to do for ``verdict`` (refunds configured, or leases held)."""
        if not verdict.charges:
            return False
        return bool(self.refund_statuses) or any(c.lease_id is not None for c in verdict.charges)


LEDGER = "ratekeeper.ledger"
"""The ASGI scope key of a request's ``RequestLedger``."""


@dataclass(slots=True)
class RequestLedger:
    """The checks of one request so far, outermost first: ``admitted`` (the core and its
    verdict) and whether an inner check refused it (see the module docstring)."""

    admitted: list[tuple[RateLimitCore, Verdict]] = field(default_factory=list)
    refused: bool = False

    async def refuse_async(self) -> None:
        """An inner check refused the request: give back what the outer ones charged."""
        self.refused = True
        admitted, self.admitted = self.admitted, []
        for core, verdict in admitted:
            await core.undo_async(verdict)

    def verdicts(self) -> list[Verdict]:
        return [verdict for _, verdict in self.admitted]


class _Lookup:
    """The ``PartLookup`` of one request: the key templates' view of it."""

    __slots__ = ("_client", "_client_key", "core", "rule_params", "view")

    def __init__(self, core: RateLimitCore, view: RequestView) -> None:
        self.core = core
        self.view = view
        self.rule_params: Mapping[str, str] = {}
        self._client: Any = None
        self._client_key: str | None = None

    def _resolve_client(self) -> None:
        if self._client is None:
            v = self.view
            client = self.core.client
            address, key = client.resolve(v.peer, lambda: v.header(client.forwarded_header))
            self._client = (address,)
            self._client_key = key

    def client_address(self) -> Any:
        self._resolve_client()
        return self._client[0]

    def __call__(self, part: str, name: str | None) -> str | None:
        view = self.view
        if part == "client_ip":
            self._resolve_client()
            return self._client_key
        if part == "header":
            return view.header(name or "")
        if part == "path":
            value = self.rule_params.get(name or "")
            return value if value is not None else view.resolved_path_params().get(name or "")
        if part == "query":
            return view.query(name or "")
        if part == "user":
            if self.core.user is not None:
                return self.core.user(view)
            return view.resolved_user()
        if part == "method":
            return view.method.upper()
        if part == "route":
            return view.resolved_route()
        if part == "host":
            return None if view.host is None else view.host.split(":", 1)[0].lower()
        return None


MISSING_COST = 1
"""What a request is charged when its cost template cannot be read from it."""


def _as_cost(value: object) -> int | None:
    """A cost from a constant, a rendered template or a callable's answer; None if not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return min(value, MAX_COUNT) if value >= 0 else None
    if isinstance(value, str):
        # ASCII digits only: str.isdigit() also accepts superscripts and other scripts'
        # digits, some of which int() refuses. A cost beyond every limit is one that no
        # limit admits, so it is capped where stores stop accepting costs.
        text = value.strip()
        return min(int(text), MAX_COUNT) if text.isascii() and text.isdigit() and len(text) <= 18 else None
    return None


def _cost_option(cost: Any) -> Any:
    if cost is None or (callable(cost) and not isinstance(cost, KeyTemplate)):
        return cost
    if isinstance(cost, Mapping):
        return {name: _cost_value(value, f"cost[{name!r}]") for name, value in cost.items()}
    return _cost_value(cost, "cost")


def _cost_value(value: Any, where: str) -> Any:
    if callable(value) and not isinstance(value, KeyTemplate):
        return value
    if isinstance(value, str):
        return KeyTemplate.parse(value)
    if isinstance(value, KeyTemplate) or (type(value) is int and value >= 0):
        return value
    raise ConfigurationError(
        f"{where} must be a non-negative int, a template such as '{{header.x-cost}}' or a callable, got {value!r}"
    )


def _exempt_keys(
    option: Mapping[str, Iterable[str] | str] | Iterable[str],
) -> tuple[dict[str, frozenset[str]], tuple[tuple[KeyTemplate, frozenset[str]], ...]]:
    """``exempt_keys`` as (rule name -> its exempt keys, (template, exempting values) pairs).

    A key is exempt only where it was meant to be: a bare list of keys, compared with
    every rule's key, would exempt a client that sends the exempt value in a header some
    other rule is keyed by."""
    if not isinstance(option, Mapping):
        items = _strings(option, "exempt_keys")
        if items:
            raise ConfigurationError(
                "exempt_keys must say what each key is exempt from: a mapping of a rule name to that rule's "
                "exempt keys, or of a key template to the values that exempt a request from every rule, e.g. "
                "{'api.per_key': ['monitoring-key'], '{client_ip}': ['10.0.0.5']}; "
                f"got the bare keys {items!r:.200}"
            )
        return {}, ()
    by_rule: dict[str, frozenset[str]] = {}
    parts: list[tuple[KeyTemplate, frozenset[str]]] = []
    for name, values in option.items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"exempt_keys: {name!r} is not a rule name or a key template such as '{{user}}'")
        keys = frozenset(_strings(values, f"exempt_keys[{name!r}]"))
        if "{" in name or "}" in name:
            parts.append((KeyTemplate.parse(name), keys))
        else:
            by_rule[name] = keys
    return by_rule, tuple(parts)


def _custom_denial(
    deny_response: DenyResponse, denied: Sequence[Decision]
) -> tuple[int, list[tuple[str, str]], bytes] | None:
    """What ``deny_response`` answered, as a status, str header pairs and a body; None
    (logged) when that is not a response a server could send: the request is still
    refused, with the standard 429, rather than turned into an error page."""
    try:
        status, extra, body = deny_response(denied)
        if type(status) is not int or not 100 <= status <= 599:
            raise ValueError(f"the status must be an int from 100 to 599, got {status!r}")
        headers = [(_header_text(name, "name"), _header_text(value, "value")) for name, value in extra]
        for name, _ in headers:
            if not name or not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a header name")
        if isinstance(body, str):
            body = body.encode()
        if not isinstance(body, bytes | bytearray):
            raise ValueError(f"the body must be bytes or str, got {type(body).__name__}")
    except Exception:
        log.exception("ratekeeper: deny_response did not answer (status, [(name, value), ...], body); sent the 429")
        return None
    return status, headers, bytes(body)


_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _header_text(value: object, what: str) -> str:
    """A header name or value as the str every integration sends (bytes as latin-1)."""
    if isinstance(value, bytes | bytearray):
        text = bytes(value).decode("latin-1")
    elif isinstance(value, str):
        text = value
    else:
        raise ValueError(f"a header {what} must be str or bytes, got {type(value).__name__}")
    if any((ch < " " and ch != "\t") or ch == "\x7f" for ch in text):
        raise ValueError(f"the header {what} {text!r:.80} holds a control character (a line break, NUL, ...)")
    try:
        text.encode("latin-1")
    except UnicodeEncodeError as exc:
        raise ValueError(f"the header {what} {text!r:.80} is not latin-1 text") from exc
    return text


def _strings(values: Iterable[str] | str, what: str) -> list[str]:
    items = [values] if isinstance(values, str) else list(values)
    for v in items:
        if not isinstance(v, str):
            raise ConfigurationError(f"{what} must be strings, got {v!r}")
    return items


class _RulesSource:
    """The rules in force: fixed ones given in code, or a file's through its watcher."""

    def __init__(self, rules: Any, metrics: Any, interval: float) -> None:
        self._fixed: RuleSet | None = None
        self._watcher: RulesWatcher[RuleSet] | None = None
        if isinstance(rules, str | os.PathLike):
            on_reload = None if metrics is None else (lambda ok, _error: metrics.reloaded(ok))
            self._watcher = RulesWatcher(rules, loader=load_rules, interval=interval, on_reload=on_reload)
        else:
            self._fixed = rules_from(rules)

    def current(self) -> RuleSet:
        if self._fixed is not None:
            return self._fixed
        assert self._watcher is not None
        return self._watcher.current
