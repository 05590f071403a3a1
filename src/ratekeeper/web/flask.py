"""A Flask extension: limits on routes and blueprints, a 429 through Flask's error handlers.

::

    from ratekeeper.web.flask import RateLimiter

    app = Flask(__name__)
    app.config["RATEKEEPER_STORE"] = "redis://cache:6379/0"
    limiter = RateLimiter(app)          # or RateLimiter() and limiter.init_app(app)

    @app.get("/login")
    @limiter.limit("5/minute")          # keyed by the client's address unless key= says otherwise
    def login(): ...

    limiter.limit("100/minute")(admin_blueprint)   # one limit shared by the blueprint's routes
    limiter.limit("10/minute")(reports_blueprint)  # nested in admin: both limits hold on its routes

    @app.get("/health")
    @limiter.exempt                     # no rule limits it, not even the app-wide ones
    def health(): ...

Configuration, from ``app.config`` (a keyword of the constructor or ``init_app`` wins):
``RATEKEEPER_STORE`` (store URL or object, ``memory://``), ``RATEKEEPER_RULES`` (app-wide
rules: a rules file path, reloaded as the middleware's are, a ``RuleSet`` or a list of
``HttpRule`` / ``Rule`` / the file's entries as dicts; read and checked at ``init_app``),
``RATEKEEPER_KEY`` (the key template of the decorators' limits, ``{client_ip}``, as
flask-limiter's default), ``RATEKEEPER_HEADER_NAMES`` (the core's ``header_names``: the
rate-limit fields under other names, checked at ``init_app``), ``RATEKEEPER_OPTIONS`` (a
mapping of the core's other options, ``ratekeeper.web.base.CoreOptions``).

Nested blueprints (``parent.register_blueprint(child)``): a blueprint's limit covers every
route registered through it, its nested blueprints' included, so a child's route is decided
by the child's limit and the parent's, in one transaction. ``exempt`` on a blueprint covers
its own routes, as flask-limiter's does by default; ``exempt(blueprint, descendants=True)``
its nested blueprints' routes too. Blueprints are told apart by object, not name: two
blueprints called ``items`` under two parents are limited apart.

One core decides each request (``ratekeeper.web.core.RateLimitCore``): a decorated route
or blueprint becomes a rule of it, named for the endpoint or the blueprint, that matches
the route's URL rule and methods and only requests Flask routed to that endpoint; it is
decided with the app-wide rules in one transaction. The core is built at the first request,
when every route is registered. A refused request raises ``RateLimitExceeded``, a
``werkzeug.exceptions.TooManyRequests``: ``@app.errorhandler(429)`` gets it (its
``verdict`` and ``headers`` say why); without such a handler the client gets the core's
answer (problem+json body, ``Retry-After``, the rate-limit headers). An admitted request's
response gets the rate-limit headers; what the core gives back after a response (refunds
by status, concurrency leases) is given back when the response is closed, and what it
cost (``response_cost``: a response header, or what the view added to
``ratekeeper.web.usage(request)`` while its body streamed) is settled then.

``flask ratekeeper limits`` lists the routes and the limits of each.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import click
from flask import Blueprint, Flask, Response, current_app, g, request
from flask.cli import AppGroup
from werkzeug.exceptions import TooManyRequests

from ratekeeper.config.model import HttpRule, KeyTemplate, Match, PathTemplate
from ratekeeper.config.sources import rules_from
from ratekeeper.errors import ConfigurationError
from ratekeeper.limiter.limiter import Limiter
from ratekeeper.rule import DEFAULT_ALGORITHM, Rule
from ratekeeper.stores.memory import MemoryStore
from ratekeeper.web.core import RateLimitCore
from ratekeeper.web.keyable import REMOTE_USER, Provides
from ratekeeper.web.request import RequestView, Verdict
from ratekeeper.web.wsgi import request_view

__all__ = ["RateLimitExceeded", "RateLimiter"]

T = TypeVar("T")

EXTENSION = "ratekeeper"
DEFAULT_KEY = "{client_ip}"
FLASK_PROVIDES = Provides("the Flask extension", {"user": REMOTE_USER})
"""What key templates get here: ``{route}`` from Flask's URL rule, ``{user}`` only from
``REMOTE_USER`` unless a ``user=`` option says otherwise (``ratekeeper.web.keyable``)."""
_VERDICT = "_ratekeeper_verdict"
_VIEW = "_ratekeeper_view"
# Werkzeug's converters as the core's path templates: int and path have their own kind,
# every other converter matches one segment (the endpoint check makes the match exact).
_CONVERTER = re.compile(r"<(?:([a-zA-Z_][a-zA-Z0-9_]*)(?:\([^)]*\))?:)?([a-zA-Z_][a-zA-Z0-9_]*)>")


class RateLimitExceeded(TooManyRequests):
    """A request the limiter refused. ``verdict`` is the core's; ``headers`` every header
    of its 429 (``Retry-After`` and the rate-limit headers)."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(description="rate limit exceeded")
        self.verdict = verdict
        self.headers = list(verdict.headers)

    def get_response(self, environ: Any = None, scope: Any = None) -> Response:
        """The core's answer: its status, headers and problem+json body."""
        headers = [(k, v) for k, v in self.headers if k.lower() != "content-length"]
        return Response(self.verdict.body, status=self.verdict.status, headers=headers)


@dataclass(frozen=True, slots=True)
class _Limits:
    """What a decorator asked for one view function or blueprint."""

    limits: tuple[str, ...]
    key: str | None
    cost: int
    algorithm: str | None
    name: str | None


@dataclass(frozen=True, slots=True)
class EndpointMatch(Match):
    """A ``Match`` that also asks which endpoint Flask routed the request to."""

    endpoints: frozenset[str] = field(default_factory=frozenset)

    def match(self, method: str, path: str, host: str | None) -> dict[str, str] | None:
        if request.endpoint not in self.endpoints:
            return None
        return Match.match(self, method, path, host)


@functools.lru_cache(maxsize=1024)  # asked on every routed request; the app's URL rules are few
def path_template(url_rule: str) -> str:
    """A Werkzeug URL rule (``/items/<int:n>``) as the core's path template (``/items/{n:int}``)."""

    def placeholder(m: re.Match[str]) -> str:
        kind = {"int": ":int", "path": ":path"}.get(m.group(1) or "", "")
        return "{" + m.group(2) + kind + "}"

    return _CONVERTER.sub(placeholder, url_rule)


class RateLimiter:
    """The Flask extension (see the module docstring). ``store``, ``rules``, ``key`` and
    every other keyword (an option of the core) override ``app.config``."""

    def __init__(self, app: Flask | None = None, **overrides: Any) -> None:
        self.overrides = overrides
        self._route_limits: dict[Callable[..., Any], list[_Limits]] = {}
        self._blueprint_limits: dict[Blueprint, list[_Limits]] = {}
        self._exempt_views: set[Callable[..., Any]] = set()
        self._exempt_blueprints: dict[object, bool] = {}
        """An exempt ``Blueprint`` -> whether its nested blueprints' routes are exempt too."""
        self._lock = threading.Lock()
        if app is not None:
            self.init_app(app)

    # -- set-up -----------------------------------------------------------------------

    def init_app(self, app: Flask, **overrides: Any) -> None:
        """Limit ``app``'s requests and add the ``flask ratekeeper`` commands."""
        state = _AppState(app, {**self.overrides, **overrides})
        # Bad rules or header names fail here, at start, not as a 500 on every request.
        where = "RateLimiter(rules=...)" if "rules" in state.overrides else "app.config['RATEKEEPER_RULES']"
        given = state.setting("rules", "RATEKEEPER_RULES", [])
        # a path is watched by the core (reloaded as the other integrations' files are)
        state.watched = given if isinstance(given, str | os.PathLike) else None
        state.rules = list(rules_from(given, source=where))
        _check_options(_core_options(state))
        app.extensions[EXTENSION] = state
        app.before_request(self._before)
        app.after_request(self._after)
        app.cli.add_command(self._commands())

    def limit(
        self,
        *limits: str,
        key: str | None = None,
        cost: int = 1,
        algorithm: str | None = None,
        name: str | None = None,
    ) -> Callable[[T], T]:
        """A decorator limiting a view function or a ``Blueprint`` by ``limits``
        (``"2/minute"``, several for one rule). ``key`` is a key template (default
        ``RATEKEEPER_KEY``, the client's address); ``name`` the rule's name (default the
        endpoint, or the blueprint's name). Placed above or below ``@app.route``."""
        entry = _Limits(tuple(limits), key, cost, algorithm, name)
        Rule(name or "check", list(limits), algorithm or DEFAULT_ALGORITHM)  # a bad limit fails at import

        def decorate(target: T) -> T:
            if isinstance(target, Blueprint):
                self._blueprint_limits.setdefault(target, []).append(entry)
            elif callable(target):
                self._route_limits.setdefault(target, []).append(entry)
            else:
                raise TypeError(f"limit() decorates a view function or a Blueprint, not {target!r}")
            return target

        return decorate

    def exempt(self, target: T, *, descendants: bool = False) -> T:
        """A decorator: no rule limits this view function or ``Blueprint``'s routes, app-wide
        ones included. A blueprint's own routes only, as flask-limiter's default; with
        ``descendants=True`` the routes of the blueprints nested in it too."""
        if isinstance(target, Blueprint):
            self._exempt_blueprints[target] = descendants
        elif descendants:
            raise TypeError("exempt(descendants=True) is for a Blueprint with nested blueprints, not a view function")
        elif callable(target):
            self._exempt_views.add(target)
        else:
            raise TypeError(f"exempt decorates a view function or a Blueprint, not {target!r}")
        return target

    # -- the rules --------------------------------------------------------------------

    def route_rules(self, app: Flask) -> list[HttpRule]:
        """The rules the decorators made for ``app``'s routes, one per decorated endpoint
        and one per decorated blueprint (covering its nested blueprints' routes, under
        every name it is registered as; named for the first: ``parent.child``)."""
        state = _state(app)
        default_key = state.setting("key", "RATEKEEPER_KEY", DEFAULT_KEY)
        by_endpoint: dict[str, tuple[list[str], set[str]]] = {}
        for url_rule in app.url_map.iter_rules():
            paths, methods = by_endpoint.setdefault(url_rule.endpoint, ([], set()))
            paths.append(path_template(url_rule.rule))
            methods.update(url_rule.methods or ())
        out: list[HttpRule] = []
        for endpoint, view in app.view_functions.items():
            for i, entry in enumerate(self._route_limits.get(view, ())):
                name = entry.name or (endpoint if i == 0 else f"{endpoint}#{i + 1}")
                out.append(self._rule(entry, name, {endpoint}, by_endpoint, default_key))
        for blueprint, entries in self._blueprint_limits.items():
            registered = [name for name, bp in app.blueprints.items() if bp is blueprint]
            prefixes = tuple(f"{name}." for name in registered)
            endpoints = {e for e in app.view_functions if registered and e.startswith(prefixes)}
            if not endpoints:
                # not registered on this app, or without routes: a rule with no path to
                # match would match every request
                continue
            for i, entry in enumerate(entries):
                name = entry.name or (registered[0] if i == 0 else f"{registered[0]}#{i + 1}")
                out.append(self._rule(entry, name, endpoints, by_endpoint, default_key))
        return out

    def exempt_endpoints(self, app: Flask) -> frozenset[str]:
        """The endpoints of ``app`` that no rule limits: the exempt view functions', and the
        routes of the exempt blueprints (their nested blueprints' with ``descendants=True``)."""
        exempt = {e for e, view in app.view_functions.items() if view in self._exempt_views}
        for name, blueprint in app.blueprints.items():
            descendants = self._exempt_blueprints.get(blueprint)
            if descendants is None:
                continue
            for endpoint in app.view_functions:
                if endpoint.rpartition(".")[0] == name or (descendants and endpoint.startswith(f"{name}.")):
                    exempt.add(endpoint)
        return frozenset(exempt)

    @staticmethod
    def _rule(
        entry: _Limits,
        name: str,
        endpoints: set[str],
        routes: Mapping[str, tuple[list[str], set[str]]],
        default_key: str,
    ) -> HttpRule:
        paths = [p for e in sorted(endpoints) for p in routes.get(e, ([], set()))[0]]
        methods = {m for e in endpoints for m in routes.get(e, ([], set()))[1]}
        rule = Rule(name, list(entry.limits), entry.algorithm or DEFAULT_ALGORITHM)
        return HttpRule(
            rule,
            match=EndpointMatch(
                methods=frozenset(methods),
                paths=tuple(PathTemplate.parse(p) for p in dict.fromkeys(paths)),
                endpoints=frozenset(endpoints),
            ),
            key=KeyTemplate.parse(entry.key or default_key),
            cost=entry.cost,
            origin=f"@limit on {', '.join(sorted(endpoints)) or name}",
        )

    def core(self, app: Flask | None = None) -> RateLimitCore:
        """``app``'s core (the current app's by default), built at its first use."""
        state = _state(app or current_app._get_current_object())  # type: ignore[attr-defined]
        with self._lock:
            if state.core is None:
                state.core = self._build(state)
            return state.core

    def _build(self, state: _AppState) -> RateLimitCore:
        app = state.app
        options = _core_options(state)
        options["store"] = state.setting("store", "RATEKEEPER_STORE", "memory://")
        user_exempt = options.pop("exempt", None)
        exempt_endpoints = self.exempt_endpoints(app)  # every route is registered by now

        def exempt(view: Any) -> bool:
            return request.endpoint in exempt_endpoints or (user_exempt is not None and bool(user_exempt(view)))

        app_rules = state.watched if state.watched is not None else state.rules
        return RateLimitCore(
            app_rules, extra_rules=self.route_rules(app), exempt=exempt, provides=FLASK_PROVIDES, **options
        )

    # -- one request --------------------------------------------------------------------

    def _before(self) -> None:
        app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
        core = self.core(app)
        view = request_view(request.environ)
        url_rule = request.url_rule
        if url_rule is not None:
            view = _with_route(view, path_template(url_rule.rule), request.view_args or {})
        verdict = core.check(view)
        setattr(g, _VERDICT, verdict)
        setattr(g, _VIEW, view)
        if not verdict.allowed:
            raise RateLimitExceeded(verdict)

    def _after(self, response: Response) -> Response:
        verdict: Verdict | None = g.pop(_VERDICT, None)
        view: RequestView | None = g.pop(_VIEW, None)
        if verdict is None or verdict.exempt:
            return response
        if not verdict.allowed:
            # A user's 429 handler answered: it still says how the client stands.
            for name, value in verdict.headers:
                if name.lower() not in ("content-type", "content-length") and name not in response.headers:
                    response.headers[name] = value
            return response
        for name, value in verdict.headers:
            response.headers[name] = value
        core = self.core()
        if core.needs_finish(verdict):
            status = response.status_code
            record = None if view is None else core.response_record(verdict, view, request.environ)
            if record is not None:
                record.started(status, response.headers.items())
            # when the server closes the response: after a streamed body too, or when the
            # client went away mid-stream (then what the app added to usage() so far)
            response.call_on_close(lambda: core.finish(verdict, status, record))
        return response

    # -- the CLI ------------------------------------------------------------------------

    def _commands(self) -> click.Group:
        group = AppGroup(EXTENSION, help="Ratekeeper's rate limits.")

        @group.command("limits")
        def limits() -> None:
            """List the routes and the limits of each."""
            app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
            for line in self.describe(app):
                click.echo(line)

        return group

    def describe(self, app: Flask) -> list[str]:
        """One line per route: its URL rule, endpoint, methods and limits (``exempt``, or
        the decorators' rules and the app-wide rules that match its path)."""
        state = _state(app)
        route_rules = self.route_rules(app)
        app_rules = state.rules
        exempt = self.exempt_endpoints(app)
        lines: list[str] = []
        for url_rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
            endpoint = url_rule.endpoint
            methods = ",".join(sorted((url_rule.methods or set()) - {"HEAD", "OPTIONS"}))
            if endpoint in exempt:
                limits = "exempt"
            else:
                template = path_template(url_rule.rule)
                found = [_summary(r) for r in route_rules if endpoint in _endpoints(r)]
                found += [_summary(r) for r in app_rules if _applies(r, template)]
                limits = "; ".join(found) or "-"
            lines.append(f"{url_rule.rule}  {endpoint}  {methods}  {limits}")
        return lines


@dataclass
class _AppState:
    """One app's settings and core."""

    app: Flask
    overrides: dict[str, Any]
    core: RateLimitCore | None = None
    rules: list[HttpRule] = field(default_factory=list)
    """The app-wide rules (``RATEKEEPER_RULES``), read at ``init_app``."""
    watched: str | os.PathLike[str] | None = None
    """The rules file of ``RATEKEEPER_RULES``, when it is one: the core reloads it."""

    def setting(self, option: str, config_name: str, default: Any) -> Any:
        """A keyword of the extension, else ``app.config[config_name]``, else ``default``."""
        if option in self.overrides:
            return self.overrides[option]
        return self.app.config.get(config_name, default)


def _core_options(state: _AppState) -> dict[str, Any]:
    """The core's options besides the rules, the key and the store: ``RATEKEEPER_OPTIONS``,
    ``RATEKEEPER_HEADER_NAMES``, then the extension's keywords (which win)."""
    config = state.app.config
    options: dict[str, Any] = dict(config.get("RATEKEEPER_OPTIONS", {}))
    if "RATEKEEPER_HEADER_NAMES" in config:
        if "header_names" in options:
            raise ConfigurationError(
                "the header names are given twice, as RATEKEEPER_HEADER_NAMES and as "
                "RATEKEEPER_OPTIONS['header_names']: keep one"
            )
        options["header_names"] = config["RATEKEEPER_HEADER_NAMES"]
    options.update({k: v for k, v in state.overrides.items() if k not in ("rules", "key", "store")})
    return options


def _check_options(options: dict[str, Any]) -> None:
    """Refuse at ``init_app`` the options the core would refuse at the first request (where
    each request would be a 500): a core built on a throwaway memory limiter and no rules
    checks them (the store is opened at the first request, after a forking server's fork;
    the rules are checked with the routes then)."""
    # a throwaway core registers no metrics series, and decides with its own limiter
    checked = {k: v for k, v in options.items() if k not in ("metrics", "limiter")}
    with Limiter(MemoryStore()) as limiter:
        try:
            RateLimitCore([], limiter=limiter, provides=FLASK_PROVIDES, **checked)
        except TypeError as exc:  # an unknown name: the core's message, with where it was given
            raise ConfigurationError(f"app.config['RATEKEEPER_OPTIONS'] or RateLimiter(...): {exc}") from None


def _state(app: Flask) -> _AppState:
    state = app.extensions.get(EXTENSION)
    if not isinstance(state, _AppState):
        raise RuntimeError("this app has no RateLimiter: call RateLimiter(app) or limiter.init_app(app)")
    return state


def _with_route(view: RequestView, route: str, params: Mapping[str, Any]) -> RequestView:
    return replace(view, route=route, path_params={k: str(v) for k, v in params.items()})


def _endpoints(rule: HttpRule) -> Iterable[str]:
    return rule.match.endpoints if isinstance(rule.match, EndpointMatch) else ()


def _applies(rule: HttpRule, template: str) -> bool:
    """Whether an app-wide rule matches a route's path (its path templates match the route's template text)."""
    if isinstance(rule.match, EndpointMatch):
        return False
    return not rule.match.paths or any(p.match(template) is not None for p in rule.match.paths)


def _summary(rule: HttpRule) -> str:
    limits = ", ".join(str(limit) for limit in rule.rule.limits)
    return f"{rule.name}: {limits} by {rule.key.describe()}"
