"""The native form of a rules file (``rules:``), read into a ``RuleSet`` of ``HttpRule``s.

Every problem of the file is collected (see ``ratekeeper.config.problems``) and raised
at once as ``ConfigProblems``; a file that loads builds exactly the ``Rule`` a user would
build in code from the same fields, so both decide alike on every store.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ratekeeper.config.checks import (
    check_algorithm,
    check_bool,
    check_burst,
    check_fields,
    check_limits,
    check_on_error,
    make_rule,
    redundant_limits,
    type_name,
)
from ratekeeper.config.model import CLIENT_ADDRESS_KEY, HttpRule, KeyTemplate, Match, PathTemplate, RuleSet
from ratekeeper.config.problems import Problems
from ratekeeper.config.quota_spec import check_quota
from ratekeeper.config.yamlfile import YamlList, YamlMap, from_data, line_of, load_file, read_yaml
from ratekeeper.errors import ConfigurationError
from ratekeeper.rule import DEFAULT_ALGORITHM

__all__ = [
    "HTTP_METHODS",
    "MATCH_FIELDS",
    "NEVER_HOSTS",
    "NEVER_METHODS",
    "NEVER_PATH",
    "RULE_FIELDS",
    "load_rules",
    "parse_rules",
    "rules_of",
    "rules_of_data",
]

TOP_FIELDS = ("rules", "version")
RULE_FIELDS = ("name", "match", "key", "limits", "algorithm", "burst", "cost", "on_error", "shadow", "quota")
MATCH_FIELDS = ("methods", "path", "host", "hosts")
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")

# An empty list in a match field means "none", so the rule matches no request. The model's
# empty field means "any", so these stand for "none": no request has them.
NEVER_METHODS = frozenset({"<none>"})
NEVER_HOSTS = frozenset({"<none>"})
NEVER_PATH = PathTemplate("<none>", re.compile(r"(?!)"), ())


def load_rules(path: str | os.PathLike[str]) -> RuleSet:
    """The rules of a native-form file; ``ConfigProblems`` listing every problem otherwise."""
    return load_file(path, parse_rules)


def parse_rules(text: str, source: str = "<string>") -> RuleSet:
    """The rules of a native-form document given as text (``source`` names it in messages)."""
    problems = Problems(source)
    return rules_of(read_yaml(text, problems), problems)


def rules_of(doc: Any, problems: Problems) -> RuleSet:
    """The rules of a document already read by ``read_yaml`` into ``problems``."""
    rules: list[HttpRule] = []
    if doc is not None or not problems:  # after a syntax error there is nothing to check
        rules = _document(doc, problems)
    problems.raise_if_any()
    return RuleSet(tuple(rules), source=problems.source, warnings=tuple(problems.warnings))


def rules_of_data(
    data: Mapping[str, Any] | Sequence[Any], source: str = "<code>", positions: Sequence[int] = ()
) -> RuleSet:
    """The native form given as Python data: a mapping as a file would hold it
    (``{"rules": [...]}``) or a list of rule mappings (``[{"name": ..., "limits": [...]}]``).

    It goes through every check a file does; a problem names its rule by its index in
    the list (``SOURCE[2]: ...``), or by ``positions[i]`` when the list given here is a
    part of a longer one.
    """
    top: Mapping[str, Any] = data if isinstance(data, Mapping) else {"rules": data}
    doc = from_data({k: v for k, v in top.items() if k != "rules"}, 0)
    if "rules" in top:
        raw = top["rules"]
        doc.key_lines["rules"] = 0
        if isinstance(raw, list | tuple):
            at = [*positions, *range(len(positions), len(raw))]
            entries = YamlList(from_data(entry, at[i] + 1) for i, entry in enumerate(raw))
            entries.line = 0
            entries.item_lines = [i + 1 for i in at[: len(raw)]]
            doc["rules"] = entries
        else:
            doc["rules"] = from_data(raw, 0)
    return rules_of(doc, Problems(source, indexed=True))


def _document(doc: Any, problems: Problems) -> list[HttpRule]:
    if not isinstance(doc, YamlMap):
        problems.add(line_of(doc, 1), f"a rules file must be a mapping with 'rules:', got {type_name(doc)}")
        return []
    if "domain" in doc:
        problems.add(
            doc.line_at("domain"),
            "this file has the Envoy form (top-level 'domain'), not the native form; "
            "load it as an Envoy configuration, or write 'rules:'",
        )
        return []
    if "descriptors" in doc and "rules" not in doc:
        # Reported as the Envoy file it most likely is, not as an unknown native field.
        problems.add(
            doc.line_at("descriptors"),
            "this file looks like the Envoy form (top-level 'descriptors') but has no 'domain:'; "
            "add domain: <name> at the top level (or write 'rules:' for the native form)",
        )
        return []
    check_fields(doc, TOP_FIELDS, "the top level", problems)
    if "version" in doc and (doc["version"] != 1 or isinstance(doc["version"], bool)):
        problems.add(doc.line_at("version"), f"version must be 1, got {type_name(doc['version'])}")
    if "rules" not in doc:
        problems.add(doc.line, "the file has no 'rules:' list; write rules: [ {name: ..., limits: [...]} ]")
        return []
    entries = doc["rules"]
    if not isinstance(entries, YamlList):
        problems.add(doc.line_at("rules"), f"rules must be a list of rules, got {type_name(entries)}")
        return []
    out: list[HttpRule] = []
    names: dict[str, int] = {}
    for entry, line in zip(entries, entries.item_lines, strict=True):
        rule = _rule(entry, line, names, problems)
        if rule is not None:
            out.append(rule)
    return out


def _rule(entry: Any, line: int, names: dict[str, int], problems: Problems) -> HttpRule | None:
    if not isinstance(entry, YamlMap):
        problems.add(line, f"each rule must be a mapping with name and limits, got {type_name(entry)}")
        return None
    check_fields(entry, RULE_FIELDS, "a rule", problems)
    ok = True
    name = entry.get("name")
    if "name" not in entry:
        problems.add(line, "a rule needs a name (unique; the metric label and the state namespace)")
        ok = False
    elif not isinstance(name, str) or not name.strip():
        problems.add(entry.line_at("name"), f"a rule's name must be a non-empty text, got {type_name(name)}")
        ok = False
    elif name in names:
        problems.add(
            entry.line_at("name"),
            f"two rules are named {name!r} (the other on line {names[name]}); rule names must be unique",
        )
        ok = False
    else:
        names[name] = entry.line_at("name")
    label = f"rule {name!r}" if isinstance(name, str) else "the rule"

    match = _match(entry["match"], entry.line_at("match"), problems) if "match" in entry else Match()
    ok = ok and match is not None
    params = _path_params(match) if match is not None else None

    key = CLIENT_ADDRESS_KEY  # no key: each client by its address; "*" says one global key
    if "key" in entry:
        parsed_key = _template(entry["key"], entry.line_at("key"), "key", params, problems)
        if parsed_key is None:
            ok = False
        else:
            key = parsed_key
            if not key.needs and not key.is_global:
                problems.warn(
                    entry.line_at("key"),
                    f"{label}: key {key.source!r} names no request part, so every request shares it; "
                    "write key: '*' for one global key, or add a part such as '{client_ip}'",
                )

    cost: int | KeyTemplate = 1
    if "cost" in entry:
        parsed_cost = _cost(entry["cost"], entry.line_at("cost"), params, problems)
        if parsed_cost is None:
            ok = False
        else:
            cost = parsed_cost

    limits = None
    if "limits" not in entry:
        problems.add(line, f"{label} has no limits; give one or more, e.g. limits: ['20/minute']")
    else:
        limits = check_limits(entry["limits"], entry.line_at("limits"), problems)
    algorithm: str | None = DEFAULT_ALGORITHM
    if "algorithm" in entry:
        algorithm = check_algorithm(entry["algorithm"], entry.line_at("algorithm"), problems)
    burst = None
    if "burst" in entry:
        burst = check_burst(entry["burst"], algorithm, entry.line_at("burst"), problems)
        ok = ok and burst is not None
    on_error = None
    if "on_error" in entry:
        on_error = check_on_error(entry["on_error"], entry.line_at("on_error"), problems)
        ok = ok and on_error is not None
    shadow = check_bool(entry["shadow"], entry.line_at("shadow"), "shadow", problems) if "shadow" in entry else False
    quota = None
    if "quota" in entry:
        quota = check_quota(entry["quota"], entry.line_at("quota"), problems)
        ok = ok and quota is not None

    if not ok or limits is None or algorithm is None or not isinstance(name, str):
        return None
    for b, a in redundant_limits(limits, burst):
        problems.warn(
            entry.line_at("limits"), f"{label}: limit {b} can never bind beside {a} (it is redundant); remove it"
        )
    rule = make_rule(name, limits, algorithm, burst, on_error, quota, line, problems)
    if rule is None or match is None:
        return None
    _warn_never(match, label, entry, problems)
    return HttpRule(rule, match, key, cost, shadow, origin=problems.where(line))


def _strings(value: Any, line: int, field: str, example: str, problems: Problems) -> list[tuple[str, int]] | None:
    """A text or a list of texts, each with its line."""
    if isinstance(value, str):
        return [(value, line)]
    if isinstance(value, YamlList):
        out: list[tuple[str, int]] = []
        for item, item_line in zip(value, value.item_lines, strict=True):
            if isinstance(item, str):
                out.append((item, item_line))
            else:
                problems.add(item_line, f"each of {field} must be a text such as {example}, got {type_name(item)}")
        return out if len(out) == len(value) else None
    problems.add(line, f"{field} must be a text such as {example} or a list of them, got {type_name(value)}")
    return None


def _match(value: Any, line: int, problems: Problems) -> Match | None:
    if not isinstance(value, YamlMap):
        problems.add(
            line,
            f"match must be a mapping of {', '.join(MATCH_FIELDS)} (omit it to match every request), "
            f"got {type_name(value)}",
        )
        return None
    check_fields(value, MATCH_FIELDS, "match", problems)
    ok = True
    methods: frozenset[str] = frozenset()
    if "methods" in value:
        items = _strings(value["methods"], value.line_at("methods"), "methods", "'GET'", problems)
        if items is None:
            ok = False
        else:
            methods = frozenset(m.upper() for m, _ in items) if items else NEVER_METHODS
    paths: tuple[PathTemplate, ...] = ()
    if "path" in value:
        items = _strings(value["path"], value.line_at("path"), "path", "'/items/{user}'", problems)
        if items is None:
            ok = False
        elif not items:
            paths = (NEVER_PATH,)
        else:
            parsed: list[PathTemplate] = []
            for text, item_line in items:
                try:
                    parsed.append(PathTemplate.parse(text))
                except ConfigurationError as exc:
                    problems.add(item_line, str(exc))
                    ok = False
            paths = tuple(parsed)
    hosts: frozenset[str] = frozenset()
    if "host" in value and "hosts" in value:
        problems.add(value.line_at("hosts"), "give host or hosts, not both (each takes a text or a list)")
        ok = False
    for field in ("host", "hosts"):
        if field in value:
            items = _strings(value[field], value.line_at(field), field, "'api.example.com'", problems)
            if items is None:
                ok = False
            else:
                hosts = frozenset(h.lower() for h, _ in items) if items else NEVER_HOSTS
    return Match(methods, paths, hosts) if ok else None


def _path_params(match: Match) -> frozenset[str] | None:
    """The parameters every path of ``match`` has (None: the match has no path at all)."""
    if not match.paths:
        return None
    common = frozenset(match.paths[0].params)
    for template in match.paths[1:]:
        common &= frozenset(template.params)
    return common


def _template(
    value: Any, line: int, field: str, params: frozenset[str] | None, problems: Problems
) -> KeyTemplate | None:
    if not isinstance(value, str):
        problems.add(line, f"{field} must be a template text such as '{{client_ip}}', got {type_name(value)}")
        return None
    try:
        template = KeyTemplate.parse(value)
    except ConfigurationError as exc:
        problems.add(line, str(exc))
        return None
    ok = True
    for part, name in template.needs:
        if part != "path" or name is None:
            continue
        if params is None:
            problems.add(
                line,
                f"{field} uses {{path.{name}}} but the rule's match has no path; "
                f"add match: {{path: '/.../{{{name}}}'}} or use another part",
            )
            ok = False
        elif name not in params:
            problems.add(
                line,
                f"{field} uses {{path.{name}}} but not every path of the rule's match has the parameter "
                f"{{{name}}}; accepted here: " + (", ".join(f"{{path.{p}}}" for p in sorted(params)) or "none"),
            )
            ok = False
    return template if ok else None


def _cost(value: Any, line: int, params: frozenset[str] | None, problems: Problems) -> int | KeyTemplate | None:
    if type(value) is int:
        if value >= 0:
            return value
        problems.add(line, f"cost must be an integer >= 0 or a template such as '{{header.x-cost}}', got {value}")
        return None
    if isinstance(value, str):
        if not value.strip():
            problems.add(line, "cost is empty; write a number (cost: 3) or a template such as '{header.x-cost}'")
            return None
        template = _template(value, line, "cost", params, problems)
        if template is not None and not template.needs:
            problems.add(
                line,
                f"cost {value!r} names no request part; write a number (cost: 3) "
                "or a template such as '{header.x-cost}'",
            )
            return None
        return template
    problems.add(
        line, f"cost must be an integer >= 0 or a template such as '{{header.x-cost}}', got {type_name(value)}"
    )
    return None


def _warn_never(match: Match, label: str, entry: YamlMap, problems: Problems) -> None:
    where = entry.line_at("match")
    if match.methods is NEVER_METHODS:
        problems.warn(where, f"{label} can never match: its methods list is empty")
    elif not match.methods & frozenset(HTTP_METHODS) and match.methods:
        problems.warn(
            where,
            f"{label} can never match a standard request: no method of {sorted(match.methods)} is an HTTP "
            f"method ({', '.join(HTTP_METHODS)})",
        )
    else:
        unknown = sorted(match.methods - frozenset(HTTP_METHODS))
        if unknown:
            problems.warn(where, f"{label}: {', '.join(unknown)} is not a standard HTTP method; check the spelling")
    if match.paths == (NEVER_PATH,):
        problems.warn(where, f"{label} can never match: its path list is empty")
    if match.hosts is NEVER_HOSTS:
        problems.warn(where, f"{label} can never match: its hosts list is empty")
