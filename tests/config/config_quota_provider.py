"""A quota provider importable by dotted path, for the rules-file tests."""

from __future__ import annotations


def lookup(key: str) -> list[str] | None:
    return None if key == "admin" else ["2/minute"]
