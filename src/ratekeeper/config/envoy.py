"""The Envoy form of a rules file: the configuration of Envoy's rate-limit service.

A ``domain`` and a tree of ``descriptors`` (``key``, optional ``value``, ``rate_limit``,
nested ``descriptors``). Matching follows Envoy's service step for step: at each level the
request entry is looked up as its composite ``key_value``, then against the level's
wildcard values in file order (``*`` anywhere, any number of times, each zero or more
characters: ``ratekeeper.config.envoy_match``), then as the value-less ``key``; a limit
applies only when the node it sits on is reached by the request's last entry. A node
without ``rate_limit`` and without children exempts what it matches.

Every limited node becomes a ``Rule`` named by its descriptor path (``domain.key_value.key2``):
that path is the state's identity in the store, so two limits sharing a YAML ``name`` (which
Envoy allows) never share a count. The ``name`` is a label, answered as Envoy answers it.
The state key of a request is made of its own entries, so a value-less key or a wildcard
gives each distinct value its own count, unless the wildcard says ``share_threshold: true``:
then every value it matches counts as the pattern itself. The algorithm defaults to
``fixed_window`` (Envoy's windows, aligned to the unit).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
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
    unknown_unit,
)
from ratekeeper.config.envoy_match import composite, is_wildcard, split_pattern, wildcard_match
from ratekeeper.config.problems import Problems, did_you_mean
from ratekeeper.config.yamlfile import YamlList, YamlMap, line_of, load_file, read_yaml
from ratekeeper.errors import ConfigurationError
from ratekeeper.limit import Limit
from ratekeeper.rule import Rule

__all__ = [
    "CHARGING",
    "DESCRIPTOR_FIELDS",
    "ENVOY_ALGORITHM",
    "RATE_LIMIT_FIELDS",
    "UNIT_SECONDS",
    "EnvoyConfig",
    "EnvoyLimit",
    "EnvoyNode",
    "envoy_of",
    "load_envoy",
    "merge_envoy",
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

CHARGING = ("envoy", "stop_over_limit", "transaction")
"""The values of the top-level ``charging`` field: which descriptors of a request are
charged when one of them is over its limit (every one, as Envoy; none of the over-limit
ones, as Envoy with ``STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT``; or none at all, decided
as one transaction)."""

ENVOY_ALGORITHM = "fixed_window"
TOP_FIELDS = ("domain", "descriptors", "charging")
DESCRIPTOR_FIELDS = (
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
)
RATE_LIMIT_FIELDS = ("unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "limits")
_FLAGS = {  # descriptor field -> EnvoyNode attribute
    "shadow_mode": "shadow",
    "quota_mode": "quota_mode",
    "detailed_metric": "detailed_metric",
    "value_to_metric": "value_to_metric",
    "share_threshold": "share_threshold",
}


@dataclass(frozen=True, slots=True)
class EnvoyLimit:
    """What applies to one request descriptor.

    ``rule`` decides (None when ``unlimited`` or ``blocked``), ``key`` is the state key to
    charge (the request's own entries, ``key_value`` joined by dots, a ``share_threshold``
    wildcard's entry counted as its pattern), ``name`` the ``rate_limit``'s YAML name
    ("" when it has none: what Envoy answers as ``current_limit.name``; only named limits can
    be replaced), ``descriptor`` the node's path (the rule's name), ``metric_key`` the key
    Envoy's service would keep its statistics under (``detailed_metric``,
    ``value_to_metric`` and ``share_threshold`` applied). ``blocked`` is
    ``requests_per_unit: 0``: every request over the limit. ``requests_per_unit`` and
    ``unit`` are as written (None when not written), for answering ``current_limit``.
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
    quota_mode: bool = False
    blocked: bool = False
    requests_per_unit: int | None = None
    unit: str | None = None
    metadata: Mapping[str, Any] | None = None


@dataclass(slots=True)
class _Level:
    """The descriptors of one level, as Envoy files them: by composite key, and the
    wildcards (already split) in file order."""

    by_key: dict[str, EnvoyNode] = field(default_factory=dict)
    wildcards: list[tuple[tuple[str, ...], EnvoyNode]] = field(default_factory=list)

    def nodes(self) -> list[EnvoyNode]:
        return list(self.by_key.values())

    def __bool__(self) -> bool:
        return bool(self.by_key)


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
    quota_mode: bool = False
    value_to_metric: bool = False
    share_threshold: bool = False
    metadata: Mapping[str, Any] | None = None
    blocked: bool = False
    requests_per_unit: int | None = None
    unit: str | None = None

    @property
    def filed_as(self) -> str:
        """The composite key the node is filed under at its level (``key`` or ``key_value``)."""
        return composite(self.key, self.value)


@dataclass(frozen=True, slots=True)
class EnvoyConfig:
    """A loaded Envoy-form file: ``resolve`` a request descriptor to the limit that applies.

    ``charging`` is the file's top-level ``charging`` (None when it has none: the service's
    choice applies). ``global_shadow`` is the service-wide shadow mode (Envoy's
    ``SHADOW_MODE``): every descriptor decided and counted, no request refused.
    """

    domain: str
    nodes: tuple[EnvoyNode, ...]
    """Every descriptor with a ``rate_limit``, in file order."""
    source: str = "<code>"
    warnings: tuple[str, ...] = ()
    _root: _Level = field(default_factory=_Level, repr=False)
    charging: str | None = None
    global_shadow: bool = False

    @property
    def rules(self) -> tuple[Rule, ...]:
        """The rules of every limited (not unlimited, not blocked) descriptor, in file order."""
        return tuple(n.rule for n in self.nodes if n.rule is not None)

    def resolve(self, entries: Sequence[tuple[str, str]]) -> EnvoyLimit | None:
        """The limit for one descriptor (its ``(key, value)`` entries), or None when none applies."""
        domain = self.domain
        level = self._root
        found: EnvoyNode | None = None
        last = len(entries) - 1
        shared: dict[int, str] = {}  # entry index -> the share_threshold pattern it counts as
        detailed = [domain]  # Envoy's detailed metric key: every entry's key_value
        labelled = [domain]  # Envoy's metric key with value_to_metric and wildcard patterns
        for i, (key, value) in enumerate(entries):
            wanted = f"{key}_{value}"
            detailed.append(wanted)
            node = level.by_key.get(wanted)
            by_value = node is not None
            pattern = ""
            if node is None:
                for parts, candidate in level.wildcards:
                    if wildcard_match(parts, wanted):
                        node, pattern = candidate, candidate.filed_as
                        break
            if node is None:
                node = level.by_key.get(key)
            if node is None:
                labelled.append(key)
                break
            pattern_value = pattern.removeprefix(f"{key}_")
            if pattern and node.share_threshold:
                shared[i] = pattern_value
            if pattern:
                shown = shared.get(i) or (value if node.value_to_metric else pattern_value)
            elif by_value:
                shown = value
            else:
                shown = value if node.value_to_metric else ""
            labelled.append(f"{key}_{shown}" if shown else key)
            if node.has_rate_limit and i == last:
                found = node
            if not node.children:
                break
            level = node.children
        if found is None:
            return None
        state_key = ".".join(
            f"{k}_{shared.get(i) or v}" if shared.get(i) or v else k for i, (k, v) in enumerate(entries)
        )
        if found.detailed_metric and shared:
            metric = ".".join(
                [domain] + [f"{k}_{shared[i]}" if i in shared else composite(k, v) for i, (k, v) in enumerate(entries)]
            )
        elif found.detailed_metric:
            metric = ".".join(detailed)
        else:
            metric = ".".join(labelled)
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
            quota_mode=found.quota_mode,
            blocked=found.blocked,
            requests_per_unit=found.requests_per_unit,
            unit=found.unit,
            metadata=found.metadata,
        )

    def resolve_all(self, descriptors: Sequence[Sequence[tuple[str, str]]]) -> list[EnvoyLimit | None]:
        """``resolve`` for each descriptor of one request, then ``replaces`` applied: a named
        limit that another matched limit replaces is dropped (None), as Envoy's service does."""
        found = [self.resolve(d) for d in descriptors]
        replaced = {name for limit in found if limit is not None for name in limit.replaces}
        return [None if limit is not None and limit.name and limit.name in replaced else limit for limit in found]

    def shadowed(self) -> EnvoyConfig:
        """This configuration under the service-wide shadow mode."""
        return dataclasses.replace(self, global_shadow=True)


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
        builder.domain,
        tuple(builder.nodes),
        problems.source,
        tuple(problems.warnings),
        _root=builder.root,
        charging=builder.charging,
    )


def merge_envoy(configs: Sequence[EnvoyConfig]) -> EnvoyConfig:
    """One configuration of several files of one domain, their top-level descriptors side
    by side (Envoy's ``MERGE_DOMAIN_CONFIG``); ``ConfigurationError`` when two files declare
    the same descriptor or ask for different ``charging``."""
    first = configs[0]
    root = _Level()
    charging: tuple[str, str] | None = None
    for config in configs:
        if config.domain != first.domain:
            raise ConfigurationError(
                f"{config.source}: domain {config.domain!r} cannot merge into {first.domain!r}; only files "
                "of one domain merge"
            )
        if config.charging is not None:
            if charging is not None and charging[0] != config.charging:
                raise ConfigurationError(
                    f"{config.source}: charging {config.charging!r}, but {charging[1]} of the same domain says "
                    f"{charging[0]!r}; give it in one file, or the same in both"
                )
            charging = (config.charging, config.source)
        for node in config._root.by_key.values():
            taken = root.by_key.get(node.filed_as)
            if taken is not None:
                raise ConfigurationError(
                    f"{node.origin}: duplicate descriptor {node.descriptor!r} (first at {taken.origin}); "
                    "files merged into one domain may not declare the same descriptor"
                )
            root.by_key[node.filed_as] = node
        root.wildcards += config._root.wildcards
    return EnvoyConfig(
        first.domain,
        tuple(n for c in configs for n in c.nodes),
        " + ".join(c.source for c in configs),
        tuple(w for c in configs for w in c.warnings),
        _root=root,
        charging=charging[0] if charging else None,
        global_shadow=any(c.global_shadow for c in configs),
    )


class _Builder:
    def __init__(self, problems: Problems) -> None:
        self.problems = problems
        self.domain = ""
        self.charging: str | None = None
        self.root = _Level()
        self.nodes: list[EnvoyNode] = []
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
        if "charging" in doc:
            charging = doc["charging"]
            if charging in CHARGING:
                self.charging = charging
            else:
                hint = did_you_mean(charging, CHARGING) if isinstance(charging, str) else ""
                problems.add(
                    doc.line_at("charging"),
                    f"charging must be one of {', '.join(CHARGING)}, got {type_name(charging)}{hint}",
                )
        if doc.get("descriptors") is not None:  # a null list (``descriptors:``) is an empty one
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
        node = EnvoyNode(key, value, f"{parent}.{composite(key, value)}", f"{problems.source}:{line}")
        if not self._place(node, level, entry.line_at("key")):
            return
        for flag, attribute in _FLAGS.items():
            if flag in entry:
                setattr(node, attribute, check_bool(entry[flag], entry.line_at(flag), flag, problems))
        if node.share_threshold and not is_wildcard(node.filed_as):
            problems.add(
                entry.line_at("share_threshold"),
                f"share_threshold applies only to a wildcard value (one holding '*'), and {node.descriptor!r} "
                "has none; give a value such as 'prefix*', or remove share_threshold",
            )
        if "metadata" in entry:
            metadata = entry["metadata"]
            if isinstance(metadata, YamlMap):
                node.metadata = metadata or None
            elif metadata is not None:
                problems.add(entry.line_at("metadata"), f"metadata must be a mapping, got {type_name(metadata)}")
        if "rate_limit" in entry:
            self.rate_limit(entry["rate_limit"], entry.line_at("rate_limit"), node)
        if entry.get("descriptors") is not None:
            self.descriptors(entry["descriptors"], entry.line_at("descriptors"), node.children, node.descriptor)

    def _place(self, node: EnvoyNode, level: _Level, line: int) -> bool:
        filed_as = node.filed_as
        taken = level.by_key.get(filed_as)
        if taken is not None:
            self.problems.add(
                line,
                f"duplicate descriptor {node.descriptor!r} (first at {taken.origin}); "
                "each key (with its value) may appear once per level",
            )
            return False
        level.by_key[filed_as] = node
        if is_wildcard(filed_as):
            level.wildcards.append((split_pattern(filed_as), node))
        return True

    def rate_limit(self, value: Any, line: int, node: EnvoyNode) -> None:
        problems = self.problems
        if not isinstance(value, YamlMap):
            problems.add(line, f"rate_limit must be a mapping with unit and requests_per_unit, got {type_name(value)}")
            return
        check_fields(value, RATE_LIMIT_FIELDS, "rate_limit", problems)
        node.has_rate_limit = True
        ok = True
        if "name" in value:
            given = value["name"]
            if not isinstance(given, str) or not given:
                problems.add(value.line_at("name"), f"name must be a non-empty text, got {type_name(given)}")
                ok = False
            else:
                node.name = given
        if "replaces" in value:
            node.replaces = self.replaces(value["replaces"], value.line_at("replaces"), node.name)
        if "unlimited" in value:
            node.unlimited = check_bool(value["unlimited"], value.line_at("unlimited"), "unlimited", problems)
        if node.unlimited:
            # Envoy takes a requests_per_unit beside unlimited (and ignores it), but no unit.
            for extra in ("unit", "limits", "algorithm", "burst"):
                if extra in value:
                    problems.add(value.line_at(extra), f"an unlimited rate_limit takes no {extra}; remove it")
            count = value.get("requests_per_unit")
            if type(count) is int and count >= 0:
                node.requests_per_unit = count
            elif "requests_per_unit" in value:
                problems.add(
                    value.line_at("requests_per_unit"),
                    f"requests_per_unit must be a whole number, 0 or more, got {type_name(count)}",
                )
            self.nodes.append(node)
            return
        limits = self.limits(value, line, node)
        algorithm: str | None = ENVOY_ALGORITHM
        if "algorithm" in value:
            algorithm = check_algorithm(value["algorithm"], value.line_at("algorithm"), problems)
        burst = None
        if "burst" in value:
            burst = check_burst(value["burst"], algorithm, value.line_at("burst"), problems)
            ok = ok and burst is not None
        if node.blocked:
            for extra in ("algorithm", "burst"):
                if extra in value:
                    problems.add(
                        value.line_at(extra), f"requests_per_unit: 0 refuses every request: it takes no {extra}"
                    )
            if ok:
                self.nodes.append(node)
            return
        if not ok or limits is None or algorithm is None:
            return
        for b, a in redundant_limits(limits, burst):
            problems.warn(line, f"{node.descriptor}: limit {b} can never bind beside {a} (it is redundant); remove it")
        node.rule = make_rule(node.descriptor, limits, algorithm, burst, None, None, line, problems)
        self.nodes.append(node)

    def limits(self, value: YamlMap, line: int, node: EnvoyNode) -> list[Limit] | None:
        """The limits of a rate_limit; None when refused, or when ``requests_per_unit: 0``
        (the node is then ``blocked``)."""
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
            problems.add(value.line_at("unit"), unknown_unit(unit, UNIT_SECONDS))
        elif isinstance(unit, str):
            node.unit = unit.lower()
        count = value.get("requests_per_unit")
        if "requests_per_unit" not in value:
            problems.add(line, "rate_limit needs requests_per_unit, a whole number (0 refuses every request)")
            return None
        if type(count) is not int or count < 0:
            problems.add(
                value.line_at("requests_per_unit"),
                f"requests_per_unit must be a whole number, 0 or more (0 refuses every request), "
                f"got {type_name(count)}",
            )
            return None
        node.requests_per_unit = count
        if count == 0:
            node.blocked = seconds is not None
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
            for node in level.nodes():
                if node.name:
                    out.append(node)
                stack.append(node.children)
        return out
