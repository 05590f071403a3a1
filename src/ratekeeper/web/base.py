"""The request-to-decision core that every HTTP integration shares (ASGI, WSGI, Django, FastAPI).

``BaseRateLimitCore`` (here) holds the options, the rules and the decision of a request;
``AsyncRateLimitCore`` (``core_async.py``: ASGI, FastAPI, async Django) and
``RateLimitCore`` (``core.py``, generated from it: WSGI, Flask, sync Django) run that
decision with an ``AsyncLimiter`` or a ``Limiter``, as httpx's ``AsyncClient`` and
``Client`` share a base. API (stable; integrations build on it)::

    core = AsyncRateLimitCore(rules=..., store="memory://", **options)   # or RateLimitCore
    view = RequestView(method="GET", path="/items/alice", host="api.example",
                       headers={"x-api-key": "k1"}, query_string="a=1", peer="10.0.0.7",
                       user=None, route=None, path_params={}, native=scope)
    verdict = await core.check(view)               # RateLimitCore: core.check(view)
    if not verdict.allowed:
        send(verdict.status, verdict.headers, verdict.body)   # the 429 (or deny_response's)
    else:
        ... call the app, add verdict.headers to its response ...
        await core.finish(verdict, status)         # refunds, lease releases

``verdict.headers`` is a list of ``(name, value)`` str pairs: on a pass, the rate-limit
headers to add to the app's response (empty when no enforced rule applied); on a denial,
every header of the 429 including ``Content-Type`` and ``Retry-After``. ``finish`` must be
called once per allowed verdict after the app answered (with 500 when the app raised); it
does nothing for exempt or unlimited requests.

Options (the same names in every integration):

- ``rules``: a path to a native-form rules file (checked for changes every
  ``reload_interval`` seconds, 1.0; a file that fails validation is refused and the old
  rules stay), a ``RuleSet``, or a list of ``HttpRule`` / ``Rule`` (a bare ``Rule``
  applies to every request, keyed by the client's address like a rule without ``key``;
  ``key: "*"`` is one global key): ``ratekeeper.config.rules_from``. A rule whose key
  the integration can never build (``provides``, ``ratekeeper.web.keyable``) is a
  ``ConfigurationError`` here, and an error in the log when a reload brings it.
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
- ``response_cost``: what a request really cost, known from its response, settled once the
  response ended (``ratekeeper.web.settle``): a response header name (``"x-tokens-used"``;
  a trailer of that name wins), ``callable(view, status, headers) -> int | None`` (the
  response's headers by lower-case name; None keeps the charge), True (the meter below
  alone), or a mapping of rule name to any of those (only those rules are settled; otherwise every rule the request was
  charged under, concurrency rules excepted: they hold leases, not counts). Without an
  answer there, the total the app added to ``ratekeeper.web.usage(request)`` is the real
  cost. The difference is charged (the key may go into debt) or refunded; a refund by
  ``refund_statuses`` wins. The rate-limit headers, sent before, show the state before it.
- ``shadow``: True (every rule) or rule names: decided but never refusing, never in
  headers; charged only when the request is admitted (``ratekeeper.limiter.transaction``).
- ``ratelimit_headers`` / ``x_ratelimit_headers`` (True): the two header families;
  ``x_ratelimit_reset``: ``"seconds"`` (from now, the default) or ``"epoch"`` (Unix
  time) for ``X-RateLimit-Reset`` (``ratekeeper.web.headers``).
- ``header_names``: a mapping from a rate-limit field's default name
  (``"X-RateLimit-Remaining"``, ``"RateLimit"``, ...) to the name to send it under, or None
  to leave it out; ``Retry-After`` keeps its name. Checked at start and resolved once
  (``ratekeeper.web.headers.header_names``).
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
``check`` only runs them (``ratekeeper.limiter.drive_async``, the shape of ``ratekeeper.limiter.flows``).

A request refused because the store is unreachable and a rule fails closed (``on_error:
deny``) is answered 503 ``limiter-unavailable`` (``ratekeeper.web.problem``), not 429.

Several checks of one request (the middleware, then a FastAPI dependency of the route)
share a ``RequestLedger`` (``LEDGER``, in the ASGI scope): the response carries one set of
rate-limit headers, for every rule that admitted it, written by the outermost check; and
when an inner check refuses, what the outer ones charged is given back, so a refusal
charges nothing anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar, Unpack

from ratekeeper.config.model import HttpRule, KeyTemplate, PathTemplate, RuleSet
from ratekeeper.config.native import load_rules
from ratekeeper.config.problems import did_you_mean
from ratekeeper.config.sources import rules_from
from ratekeeper.config.watcher import RulesWatcher
from ratekeeper.decision import INFINITE, BatchDecision, Decision
from ratekeeper.errors import ConfigurationError
from ratekeeper.keys import MAX_KEY_LENGTH, bounded_key
from ratekeeper.limiter.limiter import Limiter
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.limiter.transaction import Entry, Outcome, Step, transaction
from ratekeeper.web.client_ip import Networks, client_address
from ratekeeper.web.headers import (
    header_options,
    one_rule_headers,
    rate_limit_headers,
    retry_after_seconds,
)
from ratekeeper.web.keyable import EVERYTHING, KeyReport, Lack, Provides
from ratekeeper.web.options import (
    MISSING_COST,
    CostOption,
    DenyResponse,
    as_cost,
    cost_option,
    custom_denial,
    log,
    parse_exempt_keys,
    strings,
)
from ratekeeper.web.problem import (
    LIMITER_UNAVAILABLE_STATUS,
    PROBLEM_CONTENT_TYPE,
    problem_body,
    unavailable_body,
)
from ratekeeper.web.request import EXEMPT, PASS, Charge, RequestView, Verdict, new_charge, new_verdict
from ratekeeper.web.settle import ResponseCost, ResponseRecord, response_cost_option, settlement, settles

if TYPE_CHECKING:
    from ratekeeper.rule import Rule
    from ratekeeper.web.core_async import AsyncRateLimitCore

__all__ = ["LEDGER", "BaseRateLimitCore", "CheckFlow", "CoreOptions", "RequestLedger", "WebMetrics"]

CheckFlow = Generator[Step, Sequence[BatchDecision | Decision], Verdict]
"""Yields the calls of the request's transaction (``ratekeeper.limiter.transaction``);
receives their answers; returns the verdict."""

L = TypeVar("L", Limiter, AsyncLimiter)


class CoreOptions(TypedDict, total=False):
    """The options of the core besides ``rules`` and ``limiter``, with their types; what
    each does and its default: the module docstring. Every integration takes them as
    keywords and hands them on."""

    store: Any
    on_error: str
    trusted_proxies: Iterable[str] | str | None
    forwarded_header: str
    trusted_hops: int
    ipv6_prefix: int
    exempt_paths: Iterable[str]
    exempt_methods: Iterable[str]
    exempt_keys: Mapping[str, Iterable[str] | str] | Iterable[str]
    exempt_networks: Iterable[str] | str | None
    exempt: Callable[[RequestView], bool] | None
    user: Callable[[RequestView], str | None] | None
    key: Callable[[RequestView, HttpRule], str | None] | None
    cost: CostOption | Mapping[str, CostOption] | None
    refund_statuses: Collection[int]
    response_cost: ResponseCost | Mapping[str, ResponseCost] | None
    shadow: bool | Iterable[str]
    ratelimit_headers: bool
    x_ratelimit_headers: bool
    x_ratelimit_reset: str
    header_names: Mapping[str, str | None] | None
    deny_response: DenyResponse | None
    metrics: Any
    reload_interval: float


class WebMetrics(Protocol):
    """What the core tells a metrics object besides the limiter's observations; also
    ``configured_rules(names, source)`` when it has one (``Metrics`` does): the rules that
    get a label of their own."""

    def shadow_rules(self, names: Iterable[str]) -> None: ...
    def skipped(self, rule: str) -> None: ...
    def reloaded(self, ok: bool) -> None: ...
    def request(self, transport: str) -> None: ...


@dataclass(slots=True)
class Prepared:
    """The rules that limit a request, with its key and cost under each (made on every
    limited request's path, and never changed: not frozen, whose ``__init__`` costs a call
    per field)."""

    enforced: tuple[tuple[HttpRule, str, int], ...]
    shadow: tuple[tuple[HttpRule, str, int], ...]
    skipped: tuple[str, ...]

    @property
    def one(self) -> bool:
        """One enforced rule and no shadow rule: the transaction is one ``try_acquire``."""
        return len(self.enforced) == 1 and not self.shadow


class BaseRateLimitCore(Generic[L]):
    """What ``RateLimitCore`` and ``AsyncRateLimitCore`` share: the options, the rules, and
    the decision of a request as a flow (``check_flow``) that each of them runs with its
    kind of limiter (see the module docstring)."""

    limiter_class: type[L]
    """The limiter the subclass decides with: ``Limiter`` or ``AsyncLimiter``."""

    def __init__(
        self,
        rules: Any,
        *,
        limiter: L | None = None,
        provides: Provides = EVERYTHING,
        extra_rules: Sequence[HttpRule] = (),
        **options: Unpack[CoreOptions],
    ) -> None:
        """``provides``: what the integration can give key templates, for the start-time
        check of rules it could never key (``ratekeeper.web.keyable``; integrations pass theirs).
        ``extra_rules``: the integration's own rules, after ``rules`` (a file's too, through
        its reloads)."""
        unknown_options = options.keys() - CoreOptions.__optional_keys__
        if unknown_options:
            accepted = sorted(CoreOptions.__optional_keys__)
            hints = "".join(did_you_mean(name, accepted) for name in sorted(unknown_options))
            raise TypeError(
                f"{type(self).__name__}() got unexpected options: {', '.join(sorted(unknown_options))}{hints}; "
                f"accepted: {', '.join(accepted)}"
            )
        self.header_options = header_options(options)
        metrics = self.metrics = options.get("metrics")
        # Optional on a metrics object (``Metrics`` has it): looked up once, not per request.
        self._decision_time: Callable[[float, bool], None] | None = getattr(metrics, "decision_time", None)
        self.owns_limiter = limiter is None  # close only a limiter made here
        kind = self.limiter_class
        if limiter is not None and not isinstance(limiter, kind):
            raise ConfigurationError(
                f"{type(self).__name__} decides with a {kind.__name__}: pass one as limiter=, "
                f"not a {type(limiter).__name__} (asynchronous integrations take an AsyncLimiter)"
            )
        self.client = client_address(options)
        self.exempt_paths = tuple(
            PathTemplate.parse(p) for p in strings(options.get("exempt_paths", ()), "exempt_paths")
        )
        self.exempt_methods = frozenset(m.upper() for m in strings(options.get("exempt_methods", ()), "exempt_methods"))
        self.exempt_keys, self.exempt_parts = parse_exempt_keys(options.get("exempt_keys", ()))
        self.exempt_networks = Networks(options.get("exempt_networks"), what="exempt_networks")
        self.exempt = options.get("exempt")
        self.user = options.get("user")
        self.key = options.get("key")
        self.cost = cost_option(options.get("cost"))
        self.refund_statuses = frozenset(options.get("refund_statuses", ()))
        self.response_cost = response_cost_option(options.get("response_cost"))
        shadow = options.get("shadow", False)
        self.shadow_all = shadow is True
        self.shadow_names = frozenset() if isinstance(shadow, bool) else frozenset(strings(shadow, "shadow"))
        self.ratelimit_headers = options.get("ratelimit_headers", True)
        self.x_ratelimit_headers = options.get("x_ratelimit_headers", True)
        self.deny_response = options.get("deny_response")
        self._source = _RulesSource(rules, metrics, options.get("reload_interval", 1.0), extra_rules)
        self._reported: RuleSet | None = None
        # A key= callable builds every key itself: no key template to check then; a cost=
        # callable may still fall back to the rule's cost.
        self._keys = KeyReport(
            provides if self.user is None else provides.with_part("user"),
            log,
            keys=self.key is None,
            cost_of=self._cost_template,
        )
        self._stepped: RuleSet | None = None
        self._step_list: tuple[_Step, ...] = ()
        self.scope_checked = False
        """ASGI: whether the first request's scope was looked at for ``"user"`` (``asgi.check_scope_user``)."""
        self._report_rules(self._source.current())
        self._keys.check_exempt(template for template, _ in self.exempt_parts)
        unknown = set(self.exempt_keys) - {r.name for r in self._source.current()}
        if unknown:
            log.warning("ratekeeper: exempt_keys names rules that are not in the rules: %s", ", ".join(sorted(unknown)))
        # Made last, once every option and rule passed: a configuration refused above
        # leaves no store connection (pool) behind that nobody could close.
        if limiter is None:
            limiter = kind(
                options.get("store", "memory://"), on_error=options.get("on_error", "allow"), observer=metrics
            )
        self.limiter: L = limiter

    # -- the rules ------------------------------------------------------------------

    @property
    def rules(self) -> RuleSet:
        """The rules in force (the latest valid version of a rules file)."""
        ruleset = self._source.current()
        if ruleset is not self._reported:
            self._report_rules(ruleset)
        return ruleset

    def part_missing(self, part: str, lack: Lack) -> None:
        """An integration found at a request that it cannot provide ``part`` as it hoped
        (ASGI: the scope has no ``"user"``): warn once for each rule whose key needs it."""
        if not (part == "user" and self.user is not None):
            self._keys.missing(self.rules, part, lack)

    def _is_shadow(self, rule: HttpRule) -> bool:
        return self.shadow_all or rule.shadow or rule.name in self.shadow_names

    def _report_rules(self, ruleset: RuleSet) -> None:
        """Tell the metrics which rules are in force (only they get a label of their own)
        and which of them are in shadow mode; refuse (at start) or log (on a reload) the
        rules whose key can never be built here."""
        self._keys.check(ruleset, at_start=self._reported is None)
        self._reported = ruleset
        if self.metrics is None:
            return
        configured = getattr(self.metrics, "configured_rules", None)  # optional: other metrics objects may lack it
        if configured is not None:
            configured([r.rule for r in ruleset], source=f"web-{id(self)}")
        self.metrics.shadow_rules(sorted(r.name for r in ruleset if self._is_shadow(r)))

    # -- one request ----------------------------------------------------------------

    def check_flow(self, view: RequestView) -> CheckFlow:
        """The decision for ``view`` as a flow (see ``CheckFlow``)."""
        prepared = self.prepare(view)
        if isinstance(prepared, Verdict):
            return prepared
        return (yield from self.decision_flow(prepared))

    def decision_flow(self, prepared: Prepared) -> CheckFlow:
        """The transaction of ``prepared``'s rules, then its verdict."""
        entries = [Entry(r.rule, key, cost) for r, key, cost in prepared.enforced]
        entries += [Entry(r.rule, key, cost, shadow=True) for r, key, cost in prepared.shadow]
        outcome = yield from transaction(entries)
        return self._verdict(prepared, outcome)

    def one_verdict(self, prepared: Prepared, decision: Decision) -> Verdict:
        """The verdict of a request of one enforced rule (``Prepared.one``), decided by the
        limiter's ``try_acquire``: what its transaction's one ``try_acquire_many`` of one item is."""
        http_rule, key, cost = prepared.enforced[0]
        rule = http_rule.rule
        if decision.allowed:
            # ``_admitted`` of one pair, without the generators that take a batch apart
            headers = one_rule_headers(rule, decision, allowed=True, options=self.header_options)
            charges = (new_charge(rule, key, cost, decision.lease_id),)
            return new_verdict(True, tuple(headers), 200, b"", (decision,), (), charges, prepared.skipped, (rule,))
        # what ``_verdict`` makes of the transaction's refused ``try_acquire_many`` of one item
        headers = one_rule_headers(rule, decision, allowed=False, options=self.header_options)
        decisions = (decision,)
        # ``retry_after_seconds(decisions)`` of its one refusing decision
        us = decision.retry_us
        retry = None if us == INFINITE else max(1, -(-us // 1_000_000))
        return self._refused(prepared, (rule,), decisions, decisions, (), headers, retry)

    def headers_for(self, verdicts: Sequence[Verdict]) -> list[tuple[str, str]]:
        """One set of rate-limit headers for a request admitted by several checks (the
        middleware's and a dependency's): every enforced rule of them, the tightest first."""
        enforced = [pair for v in verdicts for pair in v.enforced]
        return rate_limit_headers(enforced, allowed=True, options=self.header_options)

    def releases(self, verdict: Verdict, status: int) -> list[Charge]:
        """What ``finish`` gives back once the app answered ``status``: every charge when the
        status is in ``refund_statuses``, else only the concurrency leases (held for the request)."""
        if status in self.refund_statuses:
            return list(verdict.charges)
        return [c for c in verdict.charges if c.lease_id is not None]

    # -- the pure parts ---------------------------------------------------------------

    def prepare(self, view: RequestView) -> Prepared | Verdict:
        """What ``view`` asks the limiter: the rules, keys and costs; the verdict itself when
        no rule limits it (``EXEMPT``, ``PASS``, or a pass naming the rules skipped).

        On every request's path: what a request needs is made when it first needs it (the
        key templates' lookup, the lists of shadow rules and skipped ones)."""
        method = view.method.upper()
        if method in self.exempt_methods:
            return EXEMPT
        path = view.path
        if self.exempt_paths and any(t.match(path) is not None for t in self.exempt_paths):
            return EXEMPT
        lookup: _Lookup | None = None
        if self.exempt_networks.networks:
            lookup = _Lookup(self, view)
            if lookup.client_address() in self.exempt_networks:
                return EXEMPT
        if self.exempt is not None and self.exempt(view):
            return EXEMPT
        if self.exempt_parts:
            lookup = lookup or _Lookup(self, view)
            for template, values in self.exempt_parts:
                if template.render(lookup) in values:
                    return EXEMPT
        enforced: list[tuple[HttpRule, str, int]] = []
        shadow: list[tuple[HttpRule, str, int]] | None = None
        skipped: list[str] | None = None
        exempted = False
        for step in self._steps():
            rule = step.rule
            if step.match_all:
                params = _NO_PARAMS
            else:
                found = rule.match.match(method, path, view.host)
                if found is None:
                    continue
                params = found
            if lookup is None:
                lookup = _Lookup(self, view)
            lookup.rule_params = params
            if step.client_key:
                key = lookup.client_key() or None
            else:
                key = rule.key.render(lookup) if self.key is None else self.key(view, rule)
            cost = step.cost if step.cost is not None or key is None else self._cost(rule, view, lookup)
            if key is None or cost is None:
                if skipped is None:
                    skipped = []
                skipped.append(rule.name)
                if self.metrics is not None:
                    self.metrics.skipped(rule.name)
                continue
            if step.exempt_keys is not None and key in step.exempt_keys:
                exempted = True
                continue
            if len(key) > MAX_KEY_LENGTH:
                key = bounded_key(key)
            if step.shadow:
                if shadow is None:
                    shadow = []
                shadow.append((rule, key, cost))
            else:
                enforced.append((rule, key, cost))
        if not enforced and not shadow:
            if exempted:
                return EXEMPT
            return PASS if skipped is None else Verdict(True, skipped=tuple(skipped))
        return Prepared(
            tuple(enforced), () if shadow is None else tuple(shadow), () if skipped is None else tuple(skipped)
        )

    def _steps(self) -> tuple[_Step, ...]:
        """What ``prepare`` does for each rule in force, worked out once per version of the rules."""
        source = self._source
        ruleset = source.fixed if source.fixed is not None else source.current()
        if ruleset is not self._stepped:
            ruleset = self.rules  # a new version: reported first (``rules``)
            self._step_list = tuple(_Step.of(self, rule) for rule in ruleset)
            self._stepped = ruleset
        return self._step_list

    def _cost_template(self, rule: HttpRule) -> object:
        """What ``_cost`` charges ``rule`` by, when a request does not decide it: the
        ``cost=`` option's value for it, else the rule's own ``cost``."""
        option: Any = self.cost
        if isinstance(option, Mapping):
            option = option.get(rule.name)
            if callable(option) and not isinstance(option, KeyTemplate):
                return None  # the rule's callable decides every request
        elif callable(option) and not isinstance(option, KeyTemplate):
            return rule.cost  # the callable may answer None: the rule's cost then
        return rule.cost if option is None else option

    def _cost(self, rule: HttpRule, view: RequestView, lookup: _Lookup) -> int | None:
        """The rule's cost for this request; None when it cannot be read from it."""
        option: Any = self.cost
        if isinstance(option, Mapping):
            option = option.get(rule.name)
            if callable(option) and not isinstance(option, KeyTemplate):
                return as_cost(option(view))
        elif callable(option) and not isinstance(option, KeyTemplate):
            value = option(view, rule)
            if value is not None:
                return as_cost(value)
            option = None
        chosen = rule.cost if option is None else option
        if isinstance(chosen, KeyTemplate):
            # A cost the request does not state (or states wrongly) is charged as 1: skipping
            # the rule would let a client dodge it by leaving the header out.
            cost = as_cost(chosen.render(lookup))
            return MISSING_COST if cost is None else cost
        return as_cost(chosen)

    def _verdict(self, prepared: Prepared, outcome: Outcome) -> Verdict:
        n = len(prepared.enforced)
        shadow = outcome.decisions[n:]
        pairs = tuple((e.rule, d) for e, d in outcome.enforced)
        if outcome.allowed:
            charged = tuple(new_charge(e.rule, e.key, e.cost, d.lease_id) for e, d in outcome.charged)
            return self._admitted(prepared, pairs, shadow, charged)
        headers = rate_limit_headers(pairs, allowed=False, options=self.header_options)
        rules = tuple(rule for rule, _ in pairs)
        decisions = outcome.decisions[:n]
        denied = tuple(d for d in decisions if not d.allowed)
        return self._refused(prepared, rules, decisions, denied, shadow, headers, retry_after_seconds(denied))

    def _refused(
        self,
        prepared: Prepared,
        rules: tuple[Rule, ...],
        decisions: tuple[Decision, ...],
        denied: tuple[Decision, ...],
        shadow: tuple[Decision, ...],
        headers: list[tuple[str, str]],
        retry: int | None,
    ) -> Verdict:
        """The verdict of a refused request: ``decisions`` those of its enforced ``rules``,
        ``denied`` those of them that refused, ``headers`` their rate-limit headers
        (``rate_limit_headers(..., allowed=False)``), ``retry`` ``retry_after_seconds(denied)``."""
        custom = None if self.deny_response is None else custom_denial(self.deny_response, denied)
        if custom is not None:
            status, extra, data = custom
            # the caller's answer says itself when to retry (or not)
            headers = [h for h in headers if h[0] != "Retry-After"] + extra
        else:
            headers.append(("Content-Type", PROBLEM_CONTENT_TYPE))
            status, data = 429, b""
            for d in denied:
                if d.fallback == "deny":  # the store is unreachable and a rule fails closed
                    status, data = LIMITER_UNAVAILABLE_STATUS, unavailable_body(denied, retry)
                    break
            else:
                data = problem_body(denied, retry)
        # a refused request charged nothing
        return new_verdict(False, tuple(headers), status, data, decisions, shadow, (), prepared.skipped, rules)

    def _admitted(
        self,
        prepared: Prepared,
        pairs: tuple[tuple[Rule, Decision], ...],
        shadow: tuple[Decision, ...],
        charges: tuple[Charge, ...],
    ) -> Verdict:
        """The verdict of an admitted request: ``pairs`` its enforced rules' decisions."""
        headers = rate_limit_headers(pairs, allowed=True, options=self.header_options)
        decisions = tuple(d for _, d in pairs)
        rules = tuple(rule for rule, _ in pairs)
        return new_verdict(True, tuple(headers), 200, b"", decisions, shadow, charges, prepared.skipped, rules)

    def needs_finish(self, verdict: Verdict) -> bool:
        """Whether ``finish`` has anything to do for ``verdict`` (refunds configured, or leases held)."""
        charges = verdict.charges
        if not charges:
            return False
        if self.refund_statuses:
            return True
        for c in charges:
            if c.lease_id is not None:
                return True
        return self.response_cost is not None and settles(self.response_cost, verdict)

    def response_record(
        self, verdict: Verdict, view: RequestView, holder: Mapping[str, Any] | None
    ) -> ResponseRecord | None:
        """What the integration notes of the response of ``verdict`` for ``finish`` to settle
        it (``response_cost``); None when nothing of it could be settled. ``holder`` is the
        mapping where the app's ``usage()`` keeps its meter (the ASGI scope, the WSGI
        environ, Django's ``request.META``)."""
        if not settles(self.response_cost, verdict):
            return None
        return ResponseRecord(view, holder)

    def finish_plan(
        self, verdict: Verdict, status: int, response: ResponseRecord | None
    ) -> tuple[list[Charge], list[tuple[Charge, int]]]:
        """What ``finish`` does once the app answered ``status``: the charges to give back
        (``releases``) and the (charge, delta) settlements of ``response_cost``. A refund by
        status gives the whole charge back and settles nothing."""
        releases = self.releases(verdict, status)
        if response is None or status in self.refund_statuses:
            return releases, []
        response.status = status
        return releases, settlement(self.response_cost, verdict, response)

    def give_back_failed(self, status: int) -> None:
        """A refund or lease release after a response of ``status`` that the store failed
        (under ``on_error="raise"``; the other policies drop it): logged, never raised into
        the server, whose response is already on its way."""
        log.warning("ratekeeper: giving back the charges of a %d response failed", status, exc_info=True)

    def settle_failed(self, charge: Charge, delta: int, exc: BaseException | None = None) -> None:
        """A settlement the store did not take: it raised ``exc``, or (None) the failure
        policy answered the charge in its place (``"allow"``/``"deny"``: nothing was
        applied). Logged (and counted when the metrics can), never raised into the server,
        whose response is already on its way."""
        log.warning(
            "ratekeeper: settling %+d for rule %s after the response failed; the request keeps what it was charged",
            delta,
            charge.rule.name,
            exc_info=exc,
        )
        counted = getattr(self.metrics, "settle_failed", None)
        if counted is not None:
            counted(charge.rule.name)


_NO_PARAMS: Mapping[str, str] = {}


@dataclass(frozen=True, slots=True)
class _Step:
    """One rule as ``prepare`` applies it, with what does not depend on the request
    worked out beforehand: whether it matches every request, whether its key is the
    client's address alone, its cost when that is a constant, shadow or not, and the keys
    it exempts."""

    rule: HttpRule
    match_all: bool
    client_key: bool
    cost: int | None
    """The cost of every request; None when it is read from the request (``_cost``)."""
    shadow: bool
    exempt_keys: frozenset[str] | None

    @classmethod
    def of(cls, core: BaseRateLimitCore[Any], rule: HttpRule) -> _Step:
        m = rule.match
        constant = core.cost is None and not isinstance(rule.cost, KeyTemplate)
        return cls(
            rule,
            match_all=not m.methods and not m.hosts and not m.paths,
            client_key=core.key is None and rule.key.parts == (("client_ip", None),),
            cost=as_cost(rule.cost) if constant else None,
            shadow=core._is_shadow(rule),
            exempt_keys=core.exempt_keys.get(rule.name),
        )


LEDGER = "ratekeeper.ledger"
"""The ASGI scope key of a request's ``RequestLedger``."""


@dataclass(slots=True)
class RequestLedger:
    """The checks of one request so far, outermost first: ``admitted`` (the core and its
    verdict) and whether an inner check refused it (see the module docstring)."""

    admitted: list[tuple[AsyncRateLimitCore, Verdict]] = field(default_factory=list)
    refused: bool = False

    async def refuse(self) -> None:
        """An inner check refused the request: give back what the outer ones charged."""
        self.refused = True
        admitted, self.admitted = self.admitted, []
        for core, verdict in admitted:
            await core.give_back(verdict.charges)

    def verdicts(self) -> list[Verdict]:
        return [verdict for _, verdict in self.admitted]


class _Lookup:
    """The ``PartLookup`` of one request: the key templates' view of it."""

    __slots__ = ("_client", "_client_key", "core", "rule_params", "view")

    def __init__(self, core: BaseRateLimitCore[Any], view: RequestView) -> None:
        self.core = core
        self.view = view
        self.rule_params: Mapping[str, str] = {}
        self._client: Any = None
        self._client_key: str | None = None

    def _resolve_client(self) -> None:
        if self._client is None:
            # the forwarding header is read only when the peer is a trusted proxy
            address, key = self.core.client.resolve(self.view.peer, self._forwarded)
            self._client = (address,)
            self._client_key = key

    def _forwarded(self) -> str | None:
        return self.view.header(self.core.client.forwarded_header)

    def client_key(self) -> str | None:
        """The ``{client_ip}`` part (``self("client_ip", None)``, without its dispatch)."""
        if self._client is None:
            # ``_resolve_client``, inlined: the key of nearly every rule
            address, self._client_key = self.core.client.resolve(self.view.peer, self._forwarded)
            self._client = (address,)
        return self._client_key

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


class _RulesSource:
    """The rules in force: fixed ones given in code, or a file's through its watcher."""

    def __init__(self, rules: Any, metrics: Any, interval: float, extra: Sequence[HttpRule] = ()) -> None:
        """``extra``: rules the integration adds after the given ones (Flask's decorators'),
        kept through every reload of a file."""
        self.fixed: RuleSet | None = None
        """The rules given in code (None: a file's, through the watcher)."""
        self._watcher: RulesWatcher[RuleSet] | None = None
        if isinstance(rules, str | os.PathLike):
            on_reload = None if metrics is None else (lambda ok, _error: metrics.reloaded(ok))

            def load(path: str) -> RuleSet:
                return load_rules(path).extended(extra)

            self._watcher = RulesWatcher(rules, loader=load, interval=interval, on_reload=on_reload)
        else:
            self.fixed = rules_from(rules).extended(extra)

    def current(self) -> RuleSet:
        if self.fixed is not None:
            return self.fixed
        assert self._watcher is not None
        return self._watcher.current
