"""What a rules file becomes: ``HttpRule``s (a ``Rule`` plus where and to whom it applies).

This module is the contract between the loaders (``ratekeeper.config.native``, and the
Envoy form) and their users (``ratekeeper.web``, ``ratekeeper.server``): it knows nothing
of YAML and nothing of HTTP frameworks. A request reaches it as a ``PartLookup``: a
function from a request part (``"header"``, ``"x-api-key"``) to its value, or None when
the request lacks it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ratekeeper.errors import ConfigurationError
from ratekeeper.rule import Rule

__all__ = [
    "CLIENT_ADDRESS_KEY",
    "GLOBAL_KEY",
    "KEY_PARTS",
    "Fallback",
    "HttpRule",
    "KeyTemplate",
    "Match",
    "PartLookup",
    "PathTemplate",
    "RuleSet",
]

# The parts a key template may name: those that stand alone, and those that take a name
# after a dot (``{header.x-api-key}``). The web layer answers each of them.
_SIMPLE_PARTS = ("client_ip", "user", "method", "route", "host")
_NAMED_PARTS = ("header", "path", "query")
KEY_PARTS = (*_SIMPLE_PARTS, *(f"{p}.<name>" for p in _NAMED_PARTS))
"""The request parts a key (or cost) template may use, as the error messages show them."""

PartLookup = Callable[[str, str | None], str | None]
"""``lookup(part, name)``: the request's value for ``{part}`` (name None) or
``{part.name}``; None when the request lacks it."""

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_PATH_PARAM = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?::(path|int|str))?$")


@dataclass(frozen=True, slots=True)
class Fallback:
    """A placeholder with alternatives, ``{user|client_ip}``: the first part the request has.

    Each alternative is a ``(part, name)`` pair, tried in order; an empty value counts as
    missing, so an anonymous request (no ``{user}``) falls through to its address.
    """

    alternatives: tuple[tuple[str, str | None], ...]

    def value(self, lookup: PartLookup) -> str | None:
        """The first alternative's value that the request has, or None when it has none."""
        for part, name in self.alternatives:
            value = lookup(part, name)
            if value:
                return value
        return None


@dataclass(frozen=True, slots=True)
class KeyTemplate:
    """Literal text and request parts, e.g. ``"{client_ip}"``, ``"org:{header.x-org}"`` or
    ``"{user|client_ip}"`` (a logged-in user, else the address).

    ``parts`` alternates literal strings, ``(part, name)`` pairs and ``Fallback`` chains.
    Two templates are special: ``CLIENT_ADDRESS_KEY``, what a rule without a key gets (its
    ``source`` is empty: nobody wrote it), and ``GLOBAL_KEY``, the whole template ``"*"``:
    one key that every request shares. A ``*`` inside a longer template is literal text.
    """

    source: str
    parts: tuple[str | tuple[str, str | None] | Fallback, ...]

    @classmethod
    def parse(cls, text: str) -> KeyTemplate:
        """The template, or ``ConfigurationError`` naming the part that is not known."""
        if not isinstance(text, str):
            raise ConfigurationError(f"a key template must be a string such as '{{client_ip}}', got {text!r}")
        if text.strip() == GLOBAL:
            return GLOBAL_KEY
        if not text:
            raise ConfigurationError(
                "an empty key template; leave the key out to key each client by its address, "
                "or write '*' for one key that every request shares"
            )
        parts: list[str | tuple[str, str | None] | Fallback] = []
        pos = 0
        for m in _PLACEHOLDER.finditer(text):
            if m.start() > pos:
                parts.append(text[pos : m.start()])
            parts.append(_parse_placeholder(m.group(1), text))
            pos = m.end()
        rest = text[pos:]
        if "{" in rest or "}" in rest:
            raise ConfigurationError(f"unbalanced brace in key template {text!r}")
        if rest:
            parts.append(rest)
        return cls(text, tuple(parts))

    @property
    def needs(self) -> tuple[tuple[str, str | None], ...]:
        """The request parts this template reads (every alternative of a fallback chain)."""
        needs: list[tuple[str, str | None]] = []
        for part in self.parts:
            if isinstance(part, Fallback):
                needs.extend(part.alternatives)
            elif isinstance(part, tuple):
                needs.append(part)
        return tuple(needs)

    @property
    def is_default(self) -> bool:
        """No key was given: the client's address (``CLIENT_ADDRESS_KEY``)."""
        return not self.source and bool(self.parts)

    @property
    def is_global(self) -> bool:
        """One key for every request (``"*"``)."""
        return not self.parts

    def describe(self) -> str:
        """How a listing shows the template: ``client address (default)``, ``global (*)``,
        else the template as written."""
        if self.is_default:
            return "client address (default)"
        if self.is_global:
            return "global (*)"
        return self.source

    def render(self, lookup: PartLookup) -> str | None:
        """The key for one request, or None when the request lacks a part it needs."""
        if not self.parts:
            return GLOBAL
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value = part.value(lookup) if isinstance(part, Fallback) else lookup(part[0], part[1])
            if value is None or value == "":
                return None
            out.append(value)
        return "".join(out)


GLOBAL = "*"
"""The key template of a global rule, and the one key it renders."""

GLOBAL_KEY = KeyTemplate(GLOBAL, ())
"""``key: "*"``: one key for every request, a budget all clients share."""

CLIENT_ADDRESS_KEY = KeyTemplate("", (("client_ip", None),))
"""The key of a rule that names none: each client by its address (``{client_ip}``), as
slowapi and flask-limiter do. Its empty ``source`` tells it from a written ``{client_ip}``."""


def _parse_placeholder(inner: str, text: str) -> tuple[str, str | None] | Fallback:
    """One ``{...}``: a request part, or a ``|`` chain of two or more distinct parts."""
    if "|" not in inner:
        return _parse_part(inner, text)
    names = [name.strip() for name in inner.split("|")]
    if any(not name for name in names):
        raise ConfigurationError(
            f"empty alternative in {{{inner}}} in key template {text!r}; "
            "a fallback chain names two or more parts, e.g. {user|client_ip}"
        )
    alternatives = tuple(_parse_part(name, text) for name in names)
    if len(set(alternatives)) < len(alternatives):
        raise ConfigurationError(f"a part appears twice in {{{inner}}} in key template {text!r}")
    return Fallback(alternatives)


def _parse_part(inner: str, text: str) -> tuple[str, str | None]:
    inner = inner.strip()
    if inner in _SIMPLE_PARTS:
        return (inner, None)
    kind, dot, name = inner.partition(".")
    if dot and kind in _NAMED_PARTS and name:
        return (kind, name.lower() if kind == "header" else name)
    close = _closest_part(inner)
    raise ConfigurationError(
        f"unknown request part {{{inner}}} in key template {text!r}"
        + (f"; did you mean {{{close}}}? Accepted: " if close else "; accepted: ")
        + ", ".join(f"{{{p}}}" for p in KEY_PARTS)
    )


def _closest_part(inner: str) -> str | None:
    """The part a misspelt one most likely meant: ``clientip`` -> ``client_ip``,
    ``headers.x-key`` -> ``header.x-key``, ``header`` -> ``header.<name>``."""
    kind, dot, name = inner.partition(".")
    if dot and name:
        named = difflib.get_close_matches(kind.lower(), _NAMED_PARTS, n=1, cutoff=0.6)
        return f"{named[0]}.{name}" if named else None
    if inner.lower() in _SIMPLE_PARTS:
        return inner.lower()
    if kind.lower() in _NAMED_PARTS:
        return f"{kind.lower()}.<name>"
    simple = difflib.get_close_matches(inner.lower(), _SIMPLE_PARTS, n=1, cutoff=0.6)
    return simple[0] if simple else None


@dataclass(frozen=True, slots=True)
class PathTemplate:
    """A path such as ``/items/{user}`` or ``/files/{rest:path}``: ``{name}`` matches one
    segment, ``{name:path}`` the rest of the path, ``{name:int}`` digits. A trailing ``*``
    matches any suffix."""

    source: str
    regex: re.Pattern[str]
    params: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> PathTemplate:
        if not isinstance(text, str) or not text.startswith("/"):
            raise ConfigurationError(f"a path must start with '/', e.g. '/items/{{user}}', got {text!r}")
        pattern = ["^"]
        params: list[str] = []
        pos = 0
        body = text[:-1] if text.endswith("*") else text
        for m in _PLACEHOLDER.finditer(body):
            pattern.append(re.escape(body[pos : m.start()]))
            spec = _PATH_PARAM.match(m.group(1).strip())
            if spec is None:
                raise ConfigurationError(
                    f"bad path parameter {{{m.group(1)}}} in {text!r}; write {{name}}, {{name:int}} or {{name:path}}"
                )
            name, kind = spec.group(1), spec.group(2) or "str"
            if name in params:
                raise ConfigurationError(f"path parameter {{{name}}} appears twice in {text!r}")
            params.append(name)
            pattern.append(f"(?P<{name}>{ {'str': '[^/]+', 'int': '[0-9]+', 'path': '.+'}[kind] })")
            pos = m.end()
        tail = body[pos:]
        if "{" in tail or "}" in tail:
            raise ConfigurationError(f"unbalanced brace in path {text!r}")
        pattern.append(re.escape(tail))
        pattern.append(".*$" if text.endswith("*") else "$")
        return cls(text, re.compile("".join(pattern)), tuple(params))

    def match(self, path: str) -> dict[str, str] | None:
        m = self.regex.match(path)
        return None if m is None else m.groupdict()


@dataclass(frozen=True, slots=True)
class Match:
    """Which requests a rule applies to; an empty field matches everything."""

    methods: frozenset[str] = frozenset()
    paths: tuple[PathTemplate, ...] = ()
    hosts: frozenset[str] = frozenset()

    def match(self, method: str, path: str, host: str | None) -> dict[str, str] | None:
        """The path parameters when the request matches (empty when there are none), else None."""
        if self.methods and method.upper() not in self.methods:
            return None
        if self.hosts and (host or "").split(":", 1)[0].lower() not in self.hosts:
            return None
        if not self.paths:
            return {}
        for template in self.paths:
            params = template.match(path)
            if params is not None:
                return params
        return None


@dataclass(frozen=True, slots=True)
class HttpRule:
    """One rule of a rules file: the ``Rule`` that decides, and when and for whom.

    ``key`` defaults to the client's address (``CLIENT_ADDRESS_KEY``); ``GLOBAL_KEY``
    (``KeyTemplate.parse("*")``) gives every request one shared key.
    ``cost`` is a constant or a template whose value must read as a non-negative integer
    (``"{header.x-cost}"``); ``shadow`` rules decide and charge but never refuse and send
    no headers. ``origin`` is ``file:line`` of the rule's entry, for messages.
    Built in code, ``key`` and ``cost`` may be given as text (``key="*"``,
    ``key="{header.x-api-key|client_ip}"``): it is parsed as a file's would be.
    """

    rule: Rule
    match: Match = field(default_factory=Match)
    key: KeyTemplate = CLIENT_ADDRESS_KEY
    cost: int | KeyTemplate = 1
    shadow: bool = False
    origin: str = ""

    if TYPE_CHECKING:  # the constructor also takes text for key and cost (``__post_init__``)

        def __init__(
            self,
            rule: Rule,
            match: Match = ...,
            key: KeyTemplate | str = ...,
            cost: int | KeyTemplate | str = ...,
            shadow: bool = ...,
            origin: str = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        # Checked here, so a rule built in code fails where it is built, not at a request.
        where = f"HttpRule {self.rule.name!r}" if isinstance(self.rule, Rule) else "HttpRule"
        if not isinstance(self.rule, Rule):
            raise ConfigurationError(f"{where}: rule must be a Rule, got {self.rule!r}")
        if not isinstance(self.match, Match):
            raise ConfigurationError(f"{where}: match must be a Match, got {self.match!r}")
        key: object = self.key
        if isinstance(key, str):
            object.__setattr__(self, "key", KeyTemplate.parse(key))
        elif not isinstance(key, KeyTemplate):
            raise ConfigurationError(f"{where}: key must be a key template text such as '{{client_ip}}', got {key!r}")
        cost: object = self.cost
        if isinstance(cost, str):
            object.__setattr__(self, "cost", KeyTemplate.parse(cost))
        elif isinstance(cost, bool) or not isinstance(cost, int | KeyTemplate) or (isinstance(cost, int) and cost < 0):
            raise ConfigurationError(
                f"{where}: cost must be a whole number of at least 0 or a template such as '{{header.x-cost}}', "
                f"got {cost!r}"
            )

    @property
    def name(self) -> str:
        return self.rule.name


@dataclass(frozen=True, slots=True)
class RuleSet:
    """The rules of one file (or of a list given in code), in the file's order."""

    rules: tuple[HttpRule, ...]
    source: str = "<code>"
    warnings: tuple[str, ...] = ()
    _by_name: Mapping[str, HttpRule] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, HttpRule] = {}
        for r in self.rules:
            if r.name in by_name:
                raise ConfigurationError(f"{self.source}: two rules are named {r.name!r}; rule names must be unique")
            by_name[r.name] = r
        object.__setattr__(self, "_by_name", by_name)  # built once: the service reads it per request

    def __iter__(self) -> Iterator[HttpRule]:
        return iter(self.rules)

    def extended(self, rules: Iterable[HttpRule]) -> RuleSet:
        """These rules, then ``rules`` (an integration's own, such as Flask's decorators');
        a name given twice is a ``ConfigurationError``, as in one file."""
        more = tuple(rules)
        return RuleSet((*self.rules, *more), self.source, self.warnings) if more else self

    def __len__(self) -> int:
        return len(self.rules)

    @property
    def by_name(self) -> Mapping[str, HttpRule]:
        return self._by_name
