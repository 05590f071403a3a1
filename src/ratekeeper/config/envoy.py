"""The Envoy form of a rules file: the configuration of Envoy's rate-limit service.

A ``domain`` and a tree of ``descriptors`` (``key``, optional ``value``, ``rate_limit``,
nested ``descriptors``). Matching follows the reference service: at each level of the
tree the request's entry is looked up as ``key`` + exact ``value``, then as a wildcard
value (``"foo*"``, the first declared that fits), then as the value-less ``key``; a limit
applies only when the node it sits on is reached by the request's last entry. A node
without ``rate_limit`` and without children exempts what it matches.

Every node with a ``rate_limit`` becomes a ``Rule`` (named ``domain.key_value.key2``, or
the ``rate_limit``'s ``name``); the state key of a request is made of its own entries, so a
value-less key (or a wildcard) gives each distinct value its own bucket, as in Envoy.
The algorithm defaults to ``fixed_window`` (Envoy's windows, aligned to the unit).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ratekeeper.config.checks import (
    check_algorithm,
    check_bool,
    check_burst,
    check_fields,
    check_limits,
    make_rule,
    redundant_limits,
    type_name,
)
from ratekeeper.config.problems import Problems, did_you_mean
from ratekeeper.config.yamlfile import YamlList, YamlMap, line_of, load_file, read_yaml
from ratekeeper.limit import Limit
from ratekeeper.rule import Rule

__all__ = [
    "DESCRIPTOR_FIELDS",
    "ENVOY_ALGORITHM",
    "RATE_LIMIT_FIELDS",
    "UNIT_SECONDS",
    "EnvoyConfig",
    "EnvoyLimit",
    "EnvoyNode",
    "envoy_of",
    "load_envoy",
    "parse_envoy",
]

UNIT_SECONDS = {
    "second": 1,
    "minute": 60,
    "hour": 3_600,
    "day": 86_400,
    "week": 604_800,
    "month": 2_592_000,  # 30 days, as Envoy's service divides
    "year": 31_536_000,  # 365 days
}
"""The length of each ``unit`` in seconds, Envoy's dividers."""

ENVOY_ALGORITHM = "fixed_window"
TOP_FIELDS = ("domain", "descriptors")
DESCRIPTOR_FIELDS = ("key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric")
RATE_LIMIT_FIELDS = ("unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "limits")


@dataclass(frozen=True, slots=True)
class EnvoyLimit:
    """What applies to one request descriptor.

    ``rule`` decides (None when ``unlimited``), ``key`` is the state key to charge (the
    request's own entries, ``key_value`` joined by dots), ``name`` the ``rate_limit``'s name
    ("" when it has none; only named limits can be replaced), ``descriptor`` the node's
    stable id and ``metric_key`` what metrics should label it with.
    """

    rule: Rule | None
    key: str
    shadow: bool = False
    unlimited: bool = False
    detailed_metric: bool = False
    replaces: tuple[str, ...] = ()
    name: str = ""
    descriptor: str = ""
    metric_key: str = ""


@dataclass(slots=True)
class _Level:
    exact: dict[tuple[str, str], EnvoyNode] = field(default_factory=dict)
    wildcards: list[tuple[str, str, EnvoyNode]] = field(default_factory=list)
    valueless: dict[str, EnvoyNode] = field(default_factory=dict)

    def find(self, key: str, value: str) -> EnvoyNode | None:
        node = self.exact.get((key, value)) if value else None
        if node is None and value:
            for wkey, prefix, candidate in self.wildcards:
                if wkey == key and value.startswith(prefix):
                    node = candidate
                    break
        if node is None:
            node = self.valueless.get(key)
        return node

    def __bool__(self) -> bool:
        return bool(self.exact or self.wildcards or self.valueless)


@dataclass(slots=True, eq=False)
class EnvoyNode:
    """One descriptor of the file: its place, its limit (if any) and its children."""

    key: str
    value: str | None
    descriptor: str
    origin: str
    rule: Rule | None = None
    has_rate_limit: bool = False
    unlimited: bool = False
    shadow: bool = False
    detailed_metric: bool = False
    replaces: tuple[str, ...] = ()
    name: str = ""
    children: _Level = field(default_factory=_Level)


@dataclass(frozen=True, slots=True)
class EnvoyConfig:
    """A loaded Envoy-form file: ``resolve`` a request descriptor to the limit that applies."""

    domain: str
    nodes: tuple[EnvoyNode, ...]
    """Every descriptor with a ``rate_limit``, in file order."""
    source: str = "<code>"
    warnings: tuple[str, ...] = ()
    _root: _Level = field(default_factory=_Level, repr=False)

    @property
    def rules(self) -> tuple[Rule, ...]:
        """The rules of every limited (not unlimited) descriptor, in file order."""
        return tuple(n.rule for n in self.nodes if n.rule is not None)

    def resolve(self, entries: Sequence[tuple[str, str]]) -> EnvoyLimit | None:
        """The limit for one descriptor (its ``(key, value)`` entries), or None when none applies."""
        level = self._root
        found: EnvoyNode | None = None
        last = len(entries) - 1
        for i, (key, value) in enumerate(entries):
            node = level.find(key, value)
            if node is not None and node.has_rate_limit and i == last:
                found = node
            if node is None or not node.children:
                break
            level = node.children
        if found is None:
            return None
        state_key = ".".join(f"{k}_{v}" if v else k for k, v in entries)
        metric = found.descriptor
        if found.detailed_metric and found.value is None and entries[-1][1]:
            metric = f"{metric}_{entries[-1][1]}"
        return EnvoyLimit(
            rule=found.rule,
            key=state_key,
            shadow=found.shadow,
            unlimited=found.unlimited,
            detailed_metric=found.detailed_metric,
            replaces=found.replaces,
            name=found.name,
            descriptor=found.descriptor,
            metric_key=metric,
        )

    def resolve_all(self, descriptors: Sequence[Sequence[tuple[str, str]]]) -> list[EnvoyLimit | None]:
        """``resolve`` for each descriptor of one request, then ``replaces`` applied: a named
        limit that another matched limit replaces is dropped (None), as Envoy's service does."""
        found = [self.resolve(d) for d in descriptors]
        replaced = {name for limit in found if limit is not None for name in limit.replaces}
        return [None if limit is not None and limit.name and limit.name in replaced else limit for limit in found]


def load_envoy(path: str | os.PathLike[str]) -> EnvoyConfig:
    """The configuration of an Envoy-form file; ``ConfigProblems`` listing every problem otherwise."""
    return load_file(path, parse_envoy)


def parse_envoy(text: str, source: str = "<string>") -> EnvoyConfig:
    """The configuration of an Envoy-form document given as text."""
    problems = Problems(source)
    return envoy_of(read_yaml(text, problems), problems)


def envoy_of(doc: Any, problems: Problems) -> EnvoyConfig:
    """The configuration of a document already read by ``read_yaml`` into ``problems``."""
    builder = _Builder(problems)
    if doc is not None or not problems:
        builder.document(doc)
    builder.check_replaces()
    problems.raise_if_any()
    return EnvoyConfig(
        builder.domain, tuple(builder.nodes), problems.source, tuple(problems.warnings), _root=builder.root
    )


class _Builder:
    def __init__(self, problems: Problems) -> None:
        self.problems = problems
        self.domain = ""
        self.root = _Level()
        self.nodes: list[EnvoyNode] = []
        self.names: dict[str, int] = {}
        self.replace_refs: list[tuple[str, int]] = []

    def document(self, doc: Any) -> None:
        problems = self.problems
        if not isinstance(doc, YamlMap):
            problems.add(line_of(doc, 1), f"an Envoy rules file must be a mapping with domain, got {type_name(doc)}")
            return
        check_fields(doc, TOP_FIELDS, "the top level", problems)
        domain = doc.get("domain")
        if not isinstance(domain, str) or not domain:
            problems.add(doc.line_at("domain"), f"domain must be a non-empty text, got {type_name(domain)}")
        else:
            self.domain = domain
        if "descriptors" in doc:
            self.descriptors(doc["descriptors"], doc.line_at("descriptors"), self.root, self.domain or "?")

    def descriptors(self, value: Any, line: int, level: _Level, parent: str) -> None:
        if not isinstance(value, YamlList):
            self.problems.add(line, f"descriptors must be a list of descriptors, got {type_name(value)}")
            return
        for entry, entry_line in zip(value, value.item_lines, strict=True):
            self.descriptor(entry, entry_line, level, parent)

    def descriptor(self, entry: Any, line: int, level: _Level, parent: str) -> None:
        problems = self.problems
        if not isinstance(entry, YamlMap):
            problems.add(
                line, f"a descriptor must be a mapping with key (and value, rate_limit...), got {type_name(entry)}"
            )
            return
        check_fields(entry, DESCRIPTOR_FIELDS, "a descriptor", problems)
        key = entry.get("key")
        if not isinstance(key, str) or not key:
            problems.add(entry.line_at("key"), f"a descriptor needs a key, a non-empty text; got {type_name(key)}")
            return
        raw_value = entry.get("value")
        value: str | None
        if raw_value is None or raw_value == "":
            value = None
        elif isinstance(raw_value, str) or (isinstance(raw_value, int) and not isinstance(raw_value, bool)):
            value = str(raw_value)
        else:
            problems.add(entry.line_at("value"), f"value must be a text, got {type_name(raw_value)}")
            return
        part = key if value is None else f"{key}_{value}"
        node = EnvoyNode(key, value, f"{parent}.{part}", f"{problems.source}:{line}")
        if self._place(node, level, entry.line_at("key")):
            for flag in ("shadow_mode", "detailed_metric"):
                if flag in entry:
                    setattr(
                        node,
                        "shadow" if flag == "shadow_mode" else flag,
                        check_bool(entry[flag], entry.line_at(flag), flag, problems),
                    )
            if "rate_limit" in entry:
                self.rate_limit(entry["rate_limit"], entry.line_at("rate_limit"), node)
            if "descriptors" in entry:
                self.descriptors(entry["descriptors"], entry.line_at("descriptors"), node.children, node.descriptor)

    def _place(self, node: EnvoyNode, level: _Level, line: int) -> bool:
        if node.value is None:
            taken = level.valueless.get(node.key)
        elif node.value.endswith("*"):
            taken = next((n for k, p, n in level.wildcards if k == node.key and p == node.value[:-1]), None)
        else:
            taken = level.exact.get((node.key, node.value))
        if taken is not None:
            self.problems.add(
                line,
                f"duplicate descriptor {node.descriptor!r} (first at {taken.origin}); "
                "each key (with its value) may appear once per level",
            )
            return False
        if node.value is None:
            level.valueless[node.key] = node
        elif node.value.endswith("*"):
            level.wildcards.append((node.key, node.value[:-1], node))
        else:
            level.exact[(node.key, node.value)] = node
        return True

    def rate_limit(self, value: Any, line: int, node: EnvoyNode) -> None:
        problems = self.problems
        if not isinstance(value, YamlMap):
            problems.add(line, f"rate_limit must be a mapping with unit and requests_per_unit, got {type_name(value)}")
            return
        check_fields(value, RATE_LIMIT_FIELDS, "rate_limit", problems)
        node.has_rate_limit = True
        ok = True
        name = node.descriptor
        if "name" in value:
            given = value["name"]
            if not isinstance(given, str) or not given:
                problems.add(value.line_at("name"), f"name must be a non-empty text, got {type_name(given)}")
                ok = False
            else:
                name = node.name = given
        if name in self.names:
            problems.add(
                value.line_at("name"),
                f"two rate limits are named {name!r} (the other on line {self.names[name]}); names must be unique",
            )
            ok = False
        else:
            self.names[name] = value.line_at("name")
        if "replaces" in value:
            node.replaces = self.replaces(value["replaces"], value.line_at("replaces"), node.name)
        unlimited = False
        if "unlimited" in value:
            unlimited = node.unlimited = check_bool(
                value["unlimited"], value.line_at("unlimited"), "unlimited", problems
            )
        if unlimited:
            for extra in ("unit", "requests_per_unit", "limits", "algorithm", "burst"):
                if extra in value:
                    problems.add(value.line_at(extra), f"an unlimited rate_limit takes no {extra}; remove it")
            self.nodes.append(node)
            return
        limits = self.limits(value, line)
        algorithm: str | None = ENVOY_ALGORITHM
        if "algorithm" in value:
            algorithm = check_algorithm(value["algorithm"], value.line_at("algorithm"), problems)
        burst = None
        if "burst" in value:
            burst = check_burst(value["burst"], algorithm, value.line_at("burst"), problems)
            ok = ok and burst is not None
        if not ok or limits is None or algorithm is None:
            return
        for b, a in redundant_limits(limits, burst):
            problems.warn(line, f"{name}: limit {b} can never bind beside {a} (it is redundant); remove it")
        node.rule = make_rule(name, limits, algorithm, burst, None, None, line, problems)
        self.nodes.append(node)

    def limits(self, value: YamlMap, line: int) -> list[Limit] | None:
        problems = self.problems
        if "limits" in value:
            for envoy_field in ("unit", "requests_per_unit"):
                if envoy_field in value:
                    problems.add(
                        value.line_at(envoy_field),
                        f"give unit and requests_per_unit, or limits, not both; remove {envoy_field} or limits",
                    )
                    return None
            return check_limits(value["limits"], value.line_at("limits"), problems)
        units = ", ".join(UNIT_SECONDS)
        unit = value.get("unit")
        if "unit" not in value:
            problems.add(line, f"rate_limit needs a unit ({units}) and requests_per_unit, or unlimited: true")
            return None
        seconds = UNIT_SECONDS.get(unit.lower()) if isinstance(unit, str) else None
        if seconds is None:
            hint = did_you_mean(unit.lower(), UNIT_SECONDS) if isinstance(unit, str) else ""
            problems.add(value.line_at("unit"), f"unknown unit {type_name(unit)}{hint}; accepted: {units}")
        count = value.get("requests_per_unit")
        if "requests_per_unit" not in value:
            problems.add(line, "rate_limit needs requests_per_unit, a positive integer")
            return None
        if type(count) is not int or count < 1:
            problems.add(
                value.line_at("requests_per_unit"),
                f"requests_per_unit must be a positive integer, got {type_name(count)}"
                + ("; 0 (refuse every request) cannot be expressed as a limit here" if count == 0 else ""),
            )
            return None
        return None if seconds is None else [Limit(count, seconds)]

    def replaces(self, value: Any, line: int, own_name: str) -> tuple[str, ...]:
        problems = self.problems
        if not isinstance(value, YamlList):
            problems.add(line, f"replaces must be a list of {{name: ...}}, got {type_name(value)}")
            return ()
        out: list[str] = []
        for item, item_line in zip(value, value.item_lines, strict=True):
            if not isinstance(item, YamlMap) or not isinstance(item.get("name"), str) or not item["name"]:
                problems.add(item_line, "each entry of replaces must be {name: <the name of another rate_limit>}")
                continue
            check_fields(item, ("name",), "a replaces entry", problems)
            if item["name"] == own_name:
                problems.add(item_line, f"a rate_limit cannot replace itself ({own_name!r}); name another one")
                continue
            out.append(item["name"])
            self.replace_refs.append((item["name"], item_line))
        return tuple(out)

    def check_replaces(self) -> None:
        named = {n.name for n in self._all_named()}
        for name, line in self.replace_refs:
            if name not in named:
                self.problems.warn(line, f"replaces {name!r}, but no rate_limit has that name; nothing is replaced")

    def _all_named(self) -> list[EnvoyNode]:
        out: list[EnvoyNode] = []
        stack = [self.root]
        while stack:
            level = stack.pop()
            for node in [*level.exact.values(), *(n for _, _, n in level.wildcards), *level.valueless.values()]:
                if node.name:
                    out.append(node)
                stack.append(node.children)
        return out
