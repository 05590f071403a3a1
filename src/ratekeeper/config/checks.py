"""Checks both forms share: fields of a mapping, limits, algorithm, burst, on_error, and the
warning for a limit that can never bind. Each check adds its problems and returns the value
(None when it is unusable), so a loader goes on and finds the next problem too."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Sequence
from typing import Any

from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.config.problems import Problems, did_you_mean
from ratekeeper.config.yamlfile import YamlList, YamlMap
from ratekeeper.errors import ConfigurationError
from ratekeeper.limit import Limit
from ratekeeper.quota import Quota
from ratekeeper.rule import POLICIES, Rule

__all__ = [
    "MAX_LIMITS",
    "check_algorithm",
    "check_bool",
    "check_burst",
    "check_fields",
    "check_limits",
    "check_on_error",
    "make_rule",
    "redundant_limits",
    "type_name",
    "unknown_unit",
]

MAX_LIMITS = 64
"""The most limits one rule may have: a rule needs a handful, and the check for a limit that
can never bind compares every pair."""

_BURST_ALGORITHMS = tuple(name for name, algo in ALGORITHMS.items() if algo.uses_burst)


def type_name(value: object) -> str:
    """How a YAML value reads to a person: 'a list', 'a mapping', 'the number 3'..."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the text {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def check_fields(mapping: YamlMap, allowed: Sequence[str], what: str, problems: Problems) -> None:
    """A problem for each key of ``mapping`` not in ``allowed``, with the closest allowed name."""
    for key in mapping:
        if key not in allowed:
            problems.add(
                mapping.line_at(key),
                f"unknown field {key!r} in {what}{did_you_mean(key, allowed)}; accepted: {', '.join(allowed)}",
            )


def check_bool(value: object, line: int, field: str, problems: Problems) -> bool:
    if isinstance(value, bool):
        return value
    problems.add(line, f"{field} must be true or false, got {type_name(value)}")
    return False


def check_limits(value: object, line: int, problems: Problems, field: str = "limits") -> list[Limit] | None:
    """One limit string or a non-empty list of them; each malformed one is its own problem."""
    if isinstance(value, str):
        items: list[Any] = [value]
        lines = [line]
    elif isinstance(value, YamlList):
        items, lines = list(value), value.item_lines
        if not items:
            problems.add(line, f"{field} is empty; give at least one limit such as '20/minute'")
            return None
        if len(items) > MAX_LIMITS:
            problems.add(line, f"{field} has {len(items)} limits; a rule takes at most {MAX_LIMITS}")
            return None
    else:
        problems.add(line, f"{field} must be a limit such as '20/minute' or a list of them, got {type_name(value)}")
        return None
    out: list[Limit] = []
    for item, item_line in zip(items, lines, strict=True):
        try:
            out.append(Limit.parse(item))
        except ConfigurationError as exc:
            problems.add(item_line, str(exc))
    return out if len(out) == len(items) else None


def check_algorithm(value: object, line: int, problems: Problems) -> str | None:
    if isinstance(value, str) and value in ALGORITHMS:
        return value
    hint = did_you_mean(value, ALGORITHMS) if isinstance(value, str) else ""
    problems.add(line, f"unknown algorithm {value!r}{hint}; accepted: {', '.join(ALGORITHMS)}")
    return None


def check_burst(value: object, algorithm: str | None, line: int, problems: Problems) -> int | None:
    if type(value) is not int or value < 1:
        problems.add(line, f"burst must be a positive integer, got {type_name(value)}")
        return None
    if algorithm is not None and algorithm not in _BURST_ALGORITHMS:
        problems.add(
            line,
            f"burst does not apply to {algorithm}; it applies to {', '.join(_BURST_ALGORITHMS)} "
            "(remove burst or change the algorithm)",
        )
        return None
    return value


def unknown_unit(unit: object, accepted: Iterable[str]) -> str:
    """The problem with an Envoy ``unit`` that is not one of ``accepted``:
    ``"unknown unit 'minuet'; did you mean 'minute'? Accepted: second, minute, ..."``."""
    choices = list(accepted)
    listed = ", ".join(choices)
    if not isinstance(unit, str):
        return f"unit must be a text such as 'minute', got {type_name(unit)}; accepted: {listed}"
    close = difflib.get_close_matches(unit.lower(), choices, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}? Accepted" if close else "; accepted"
    return f"unknown unit {unit!r}{hint}: {listed}"


def check_on_error(value: object, line: int, problems: Problems) -> str | None:
    if isinstance(value, str) and value in POLICIES:
        return value
    hint = did_you_mean(value, POLICIES) if isinstance(value, str) else ""
    problems.add(line, f"on_error must be one of {', '.join(POLICIES)}, got {type_name(value)}{hint}")
    return None


def make_rule(
    name: str,
    limits: list[Limit],
    algorithm: str,
    burst: int | None,
    on_error: str | None,
    quota: Quota | None,
    line: int,
    problems: Problems,
) -> Rule | None:
    """The ``Rule``, or None after adding what ``Rule`` itself refused (checks the loaders do not repeat)."""
    try:
        return Rule(name, limits, algorithm, burst=burst, on_error=on_error, quota=quota)
    except ConfigurationError as exc:
        problems.add(line, str(exc))
        return None


def redundant_limits(limits: Sequence[Limit], burst: int | None = None) -> list[tuple[Limit, Limit]]:
    """``(b, a)`` for each limit ``b`` that limit ``a`` of the same rule keeps from ever binding.

    Within any span of ``b.period`` at most ``a.capacity * ceil(b.period / a.period)`` can
    pass ``a`` (its burst counted, so the test stays on the safe side), so ``b`` is
    redundant when its count is at least that. Of two equal limits only the later is named.
    """
    out: list[tuple[Limit, Limit]] = []
    for j, b in enumerate(limits):
        for i, a in enumerate(limits):
            if i == j or (a == b and i > j):
                continue
            capacity = a.burst or burst or a.count
            if b.count >= max(capacity, a.count) * math.ceil(b.period_us / a.period_us):
                out.append((b, a))
                break
    return out
