"""Store options from URLs and keywords: checked once here for every store."""

from __future__ import annotations

from typing import Any

from ratekeeper.errors import ConfigurationError

__all__ = ["bool_option", "number_option"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def bool_option(name: str, value: Any) -> bool:
    """A flag given as a bool or as one of the usual words (URL query values are strings)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    raise ConfigurationError(f"store option {name} must be true or false, got {value!r}")


def number_option(name: str, value: Any, kind: type, minimum: float) -> Any:
    """A number of ``kind`` (int, or float seconds) at least ``minimum``; bools refused."""
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = None
    if number is None or isinstance(value, bool) or not number >= minimum:
        what = "an integer" if kind is int else "a number of seconds"
        raise ConfigurationError(f"store option {name} must be {what} >= {minimum}, got {value!r}")
    return number
