"""Rules whose key an integration can never build, found when the rules are loaded.

A rule whose key template needs a request part the request lacks is skipped for that
request (``ratekeeper.web.base``). That is right for a part one request has and another
lacks (a header, a logged-in user), but a part the integration itself can never provide
(``{route}`` under the plain WSGI middleware, which has no router) would skip the rule on
every request: a limit that silently limits nothing. ``unkeyable`` finds such rules from
the rules alone and what an integration declares it provides (``Provides``), so the core
refuses them at start (``ConfigurationError``) and logs them on a reload, instead.

A part is ``ALWAYS`` provided when the integration can read it from a request (the request
may still lack it: that is the request's business), ``MAYBE`` when only something outside
the integration can put it there (``REMOTE_USER``, set or not by the WSGI server: a
warning), ``NEVER`` when nothing can. A fallback chain ``{route|client_ip}`` is as good
as its best alternative; a template is as bad as its worst placeholder. A ``key=``
callable option replaces every template, so the core does not run this check then.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ratekeeper.config.model import Fallback, HttpRule, KeyTemplate
from ratekeeper.errors import ConfigurationError

__all__ = [
    "DJANGO_AUTH",
    "EVERYTHING",
    "NO_ROUTER",
    "NO_SCOPE_USER",
    "REMOTE_USER",
    "KeyReport",
    "Lack",
    "Provides",
    "Supply",
    "Unkeyable",
    "django_user_lack",
    "unkeyable",
]


CostOf = Callable[[HttpRule], object] | None
"""The cost a rule is charged by, as the core's ``cost=`` option makes it (a template is checked)."""


class Supply(enum.IntEnum):
    """How an integration provides one request part; ordered from worst to best."""

    NEVER = 0
    MAYBE = 1
    ALWAYS = 2


@dataclass(frozen=True, slots=True)
class Lack:
    """A part an integration cannot always provide: how badly, why, and what to do instead."""

    supply: Supply
    why: str
    remedy: str


@dataclass(frozen=True, slots=True)
class Provides:
    """What one integration can give key templates. ``lacks`` names each part it cannot
    always provide (a part not named is ``ALWAYS``); ``integration`` names it in messages."""

    integration: str
    lacks: Mapping[str, Lack] = field(default_factory=dict)

    def supply(self, part: str) -> Supply:
        lack = self.lacks.get(part)
        return Supply.ALWAYS if lack is None else lack.supply

    def with_part(self, part: str) -> Provides:
        """The same, but ``part`` always provided (e.g. a ``user=`` option supplies ``{user}``)."""
        return Provides(self.integration, {p: lack for p, lack in self.lacks.items() if p != part})

    def lacking(self, part: str, lack: Lack) -> Provides:
        """The same, but ``part`` provided only as ``lack`` says (found at the first request)."""
        return Provides(self.integration, {**self.lacks, part: lack})


EVERYTHING = Provides("the web core")
"""What the core assumes when an integration declares nothing: every part (no check)."""

_USER_REMEDY = "give a user= callable (it receives the RequestView), or a fallback such as '{user|client_ip}'"

NO_ROUTER = Lack(
    Supply.NEVER,
    "it has no router to ask which route matched",
    "key by a fallback such as '{route|client_ip}', by the rule's own path parameters "
    "('{path.NAME}' with match: {path: '/items/{NAME}'}), or use an integration that knows the "
    "route (the Flask extension ratekeeper.web.flask.RateLimiter, Django's or the ASGI middleware)",
)
"""``{route}`` under the plain WSGI middleware."""

REMOTE_USER = Lack(
    Supply.MAYBE,
    "it reads REMOTE_USER, which only the WSGI server or a middleware in front of this one sets",
    _USER_REMEDY,
)
"""``{user}`` under a WSGI integration without a ``user=`` option."""

NO_SCOPE_USER = Lack(
    Supply.MAYBE,
    "the first request's ASGI scope had no 'user'; Starlette's AuthenticationMiddleware, "
    "placed before the rate-limit middleware, sets it",
    "add AuthenticationMiddleware before it, " + _USER_REMEDY,
)
"""``{user}`` under ASGI when the first request's scope has no ``"user"``."""


@dataclass(frozen=True, slots=True)
class Unkeyable:
    """A rule whose key (or cost template: ``field``) needs ``part``, which the integration
    provides only as ``lack`` says."""

    rule: HttpRule
    part: str
    """The placeholder that cannot be filled, as written: ``route`` or ``route|user``."""
    lack: Lack
    field: str = "key"
    """``"key"``, or ``"cost"``: a cost that cannot be read is charged as 1."""
    cost: KeyTemplate | None = None
    """The cost template (``field`` ``"cost"``): the rule's, or the ``cost=`` option's."""

    @property
    def never(self) -> bool:
        """True: the rule can never be keyed (an error); False: maybe not (a warning)."""
        return self.lack.supply is Supply.NEVER

    @property
    def template(self) -> KeyTemplate:
        return self.cost if self.cost is not None else self.rule.key

    def message(self, integration: str) -> str:
        where = f"{self.rule.origin}: " if self.rule.origin else ""
        if self.field == "cost":
            outcome = "so every request would be charged 1" if self.never else "so a request without it is charged 1"
        else:
            outcome = (
                "so the rule would limit no request" if self.never else "so the rule limits only requests that have it"
            )
        return (
            f"{where}rule {self.rule.name!r}: its {self.field} {self.template.source!r} needs {{{self.part}}}, "
            f"which {integration} {'can never provide' if self.never else 'may not provide'} "
            f"({self.lack.why}), {outcome}; {self.lack.remedy}"
        )


def unkeyable(
    rules: Iterable[HttpRule], provides: Provides, *, keys: bool = True, cost_of: CostOf = None
) -> list[Unkeyable]:
    """Each rule whose key template (unless ``keys`` is False: a ``key=`` callable builds
    them) or cost template cannot always be built under ``provides``: its worst placeholder
    (a ``NEVER`` before a ``MAYBE``), in the rules' order. ``cost_of`` gives the cost
    template a rule is charged by (the core's ``cost=`` option may replace the rule's);
    the rule's own ``cost`` by default."""
    out: list[Unkeyable] = []
    for rule in rules:
        found = _worst(rule.key, provides) if keys else None
        if found is not None:
            out.append(Unkeyable(rule, *found))
        cost = cost_of(rule) if cost_of is not None else rule.cost
        if isinstance(cost, KeyTemplate):
            found = _worst(cost, provides)
            if found is not None:
                out.append(Unkeyable(rule, *found, field="cost", cost=cost))
    return out


def _worst(template: KeyTemplate, provides: Provides) -> tuple[str, Lack] | None:
    """The placeholder of ``template`` that ``provides`` supplies least, with its lack;
    None when every placeholder is always supplied."""
    worst: tuple[str, Lack] | None = None
    for piece in template.parts:
        if isinstance(piece, str):
            continue
        alternatives = piece.alternatives if isinstance(piece, Fallback) else (piece,)
        best = max(provides.supply(part) for part, _ in alternatives)
        if best is Supply.ALWAYS:
            continue
        # The lack to report: the first alternative as good as the chain's best.
        part = next(p for p, _ in alternatives if provides.supply(p) is best)
        lack = provides.lacks[part]
        if worst is None or lack.supply < worst[1].supply:
            worst = ("|".join(_written(p, n) for p, n in alternatives), lack)
    return worst


def _written(part: str, name: str | None) -> str:
    return part if name is None else f"{part}.{name}"


DJANGO_AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"
DJANGO_RATELIMIT = "ratekeeper.web.django.RateLimitMiddleware"


def django_user_lack(middleware: Sequence[str]) -> Lack | None:
    """What ``{user}`` lacks under Django's ``settings.MIDDLEWARE``: only a middleware
    listed before ratekeeper's runs before it decides, so ``request.user`` is there when
    ``AuthenticationMiddleware`` is among them (None), may be when another one is (a
    project's own middleware may set it: a warning), and never when none is."""
    names = list(middleware)
    before = names[: names.index(DJANGO_RATELIMIT)] if DJANGO_RATELIMIT in names else names
    if DJANGO_AUTH in before:
        return None
    remedy = (
        f"put {DJANGO_AUTH} before {DJANGO_RATELIMIT}, give a 'user' callable in settings.RATEKEEPER "
        "(it receives the RequestView), or a fallback such as '{user|client_ip}'"
    )
    where = "after it" if DJANGO_AUTH in names else "nowhere"
    if before:
        why = f"settings.MIDDLEWARE has {DJANGO_AUTH} {where}; only {', '.join(before)} may set request.user"
        return Lack(Supply.MAYBE, why, remedy)
    why = f"settings.MIDDLEWARE runs nothing before {DJANGO_RATELIMIT} and has {DJANGO_AUTH} {where}"
    return Lack(Supply.NEVER, why, remedy)


class KeyReport:
    """The core's report of rules it cannot key: raised at start, logged on each reload,
    each maybe-missing part warned once per rule (the same rule and key after a reload
    are not warned again)."""

    def __init__(
        self, provides: Provides, logger: logging.Logger, *, keys: bool = True, cost_of: CostOf = None
    ) -> None:
        self.provides = provides
        self._log = logger
        self._keys = keys
        self._cost_of = cost_of
        self._warned: set[tuple[str, str, str, str]] = set()

    def check(self, rules: Iterable[HttpRule], *, at_start: bool) -> None:
        """Raise ``ConfigurationError`` (``at_start``) or log an error for each rule that
        can never be keyed; warn once for each that may not be."""
        found = unkeyable(rules, self.provides, keys=self._keys, cost_of=self._cost_of)
        never = [u.message(self.provides.integration) for u in found if u.never]
        if never and at_start:
            raise ConfigurationError("\n".join(never))
        for text in never:
            self._log.error("ratekeeper: %s (the rules were reloaded with it)", text)
        self._warn([u for u in found if not u.never])

    def check_exempt(self, templates: Iterable[KeyTemplate]) -> None:
        """Refuse each ``exempt_keys`` template the integration can never fill (it would
        exempt no request); warn for one it may not fill. Called once, at start."""
        never: list[str] = []
        for template in templates:
            found = _worst(template, self.provides)
            if found is None:
                continue
            part, lack = found
            bad = lack.supply is Supply.NEVER
            text = (
                f"exempt_keys: the template {template.source!r} needs {{{part}}}, which "
                f"{self.provides.integration} {'can never provide' if bad else 'may not provide'} ({lack.why}), "
                f"so it {'would exempt no request' if bad else 'exempts only requests that have it'}; {lack.remedy}"
            )
            if bad:
                never.append(text)
            else:
                self._log.warning("ratekeeper: %s", text)
        if never:
            raise ConfigurationError("\n".join(never))

    def missing(self, rules: Iterable[HttpRule], part: str, lack: Lack) -> None:
        """Found at a request: ``part`` is provided only as ``lack`` says from now on; warn
        once for each rule that needs it."""
        self.provides = self.provides.lacking(part, lack)
        found = unkeyable(rules, self.provides, keys=self._keys, cost_of=self._cost_of)
        self._warn([u for u in found if u.lack is lack])

    def _warn(self, found: Iterable[Unkeyable]) -> None:
        for u in found:
            seen = (u.rule.name, u.field, u.template.source, u.part)
            if seen not in self._warned:
                self._warned.add(seen)
                self._log.warning("ratekeeper: %s", u.message(self.provides.integration))
