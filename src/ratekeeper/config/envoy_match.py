"""Wildcard values of the Envoy form, matched as Envoy's rate-limit service matches them.

A descriptor's ``value`` may hold ``*`` anywhere, any number of times; each ``*`` stands
for zero or more characters. Envoy matches the pattern against the request entry's
composite ``key_value`` text (not the value alone), so ``key: k, value: "*"`` also matches
an entry of key ``k`` with an empty value. The pattern is split on ``*`` once, when the
file is loaded; a match then only scans the text.
"""

from __future__ import annotations

__all__ = ["composite", "is_wildcard", "split_pattern", "wildcard_match"]


def composite(key: str, value: str | None) -> str:
    """The name a descriptor is filed under at its level: ``key``, or ``key_value``."""
    return f"{key}_{value}" if value else key


def is_wildcard(text: str) -> bool:
    """Whether a composite key is a pattern (it holds a ``*``)."""
    return "*" in text


def split_pattern(pattern: str) -> tuple[str, ...]:
    """The literal pieces between the ``*`` of a pattern (``"a*b*"`` -> ``("a", "b", "")``)."""
    return tuple(pattern.split("*"))


def wildcard_match(parts: tuple[str, ...], text: str) -> bool:
    """Whether ``text`` matches the pattern split into ``parts``.

    The first piece must start the text and the last must end it; the pieces between are
    found in order, each as early as it occurs, in what lies between (the earliest
    occurrence leaves the most room for the rest, so this decides every pattern).
    """
    if len(parts) == 1:
        return parts[0] == text
    first, last = parts[0], parts[-1]
    if len(text) < sum(len(p) for p in parts):
        return False
    if not text.startswith(first) or not text.endswith(last):
        return False
    start, end = len(first), len(text) - len(last)
    for part in parts[1:-1]:
        found = text.find(part, start, end)
        if found < 0:
            return False
        start = found + len(part)
    return True
