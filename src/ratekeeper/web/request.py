"""What an integration tells the web core about a request (``RequestView``) and what the
core answers (``Verdict``, with the ``Charge``s to give back after the response)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from ratekeeper.decision import Decision
from ratekeeper.rule import Rule

__all__ = ["EXEMPT", "PASS", "Charge", "LazyHeaders", "RequestView", "Verdict"]


class LazyHeaders(Mapping[str, str]):
    """A request's headers by lower-case name, as an integration hands them to the core:
    ``get`` looks one name up in the framework's own form (a request's rules read a header
    or two), ``every`` builds the whole mapping, only when it is walked."""

    __slots__ = ()

    def get(self, name: str, default: Any = None) -> Any:
        raise NotImplementedError

    def every(self) -> dict[str, str]:
        raise NotImplementedError

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[str]:
        return iter(self.every())

    def __len__(self) -> int:
        return len(self.every())


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


# Built by the core on every limited request: a frozen dataclass's ``__init__`` pays one
# ``object.__setattr__`` call per field (about four times the cost of plain stores). The
# factories below fill a mutable twin of the same slots, then give the object its real class:
# the result is a true ``Verdict`` / ``Charge`` (frozen, equal, hashed and shown the same).
_OpenVerdict = type("_OpenVerdict", (), {"__slots__": Verdict.__slots__})
_OpenCharge = type("_OpenCharge", (), {"__slots__": Charge.__slots__})
_new = object.__new__


def new_verdict(
    allowed: bool,
    headers: tuple[tuple[str, str], ...],
    status: int,
    body: bytes,
    decisions: tuple[Decision, ...],
    shadow: tuple[Decision, ...],
    charges: tuple[Charge, ...],
    skipped: tuple[str, ...],
    rules: tuple[Rule, ...],
) -> Verdict:
    """``Verdict(allowed, headers, status, body, decisions, shadow, charges, skipped,
    rules=rules)`` (not exempt), built without the frozen ``__init__``."""
    v: Any = _new(_OpenVerdict)
    v.allowed = allowed
    v.headers = headers
    v.status = status
    v.body = body
    v.decisions = decisions
    v.shadow = shadow
    v.charges = charges
    v.skipped = skipped
    v.exempt = False
    v.rules = rules
    v.__class__ = Verdict
    return v  # type: ignore[no-any-return]


def new_charge(rule: Rule, key: str, cost: int, lease_id: str | None) -> Charge:
    """``Charge(rule, key, cost, lease_id)``, built without the frozen ``__init__``."""
    c: Any = _new(_OpenCharge)
    c.rule = rule
    c.key = key
    c.cost = cost
    c.lease_id = lease_id
    c.__class__ = Charge
    return c  # type: ignore[no-any-return]


PASS = Verdict(True)
"""A request no rule limited."""
EXEMPT = Verdict(True, exempt=True)
"""A request exempt from every rule."""
