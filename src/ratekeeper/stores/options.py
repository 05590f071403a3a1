"""Store options from URLs and keywords: checked once here for every store."""

from __future__ import annotations

from typing import Any

from ratekeeper.errors import ConfigurationError

__all__ = ["bool_option", "number_option", "prefix_option"]

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


def prefix_option(value: Any) -> str:
    """The store option ``prefix``, checked: a str that every store can hold as it is (no
    NUL, which PostgreSQL's text cannot hold; no lone surrogate, which UTF-8 cannot
    encode). It is put before every storage key as it is, not escaped."""
    if not isinstance(value, str):
        raise ConfigurationError(f"store option prefix must be a str, got {value!r}")
    if "\x00" in value:
        raise ConfigurationError(f"store option prefix must not contain NUL, got {value!r}")
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            f"store option prefix holds a lone surrogate at index {exc.start}, which no store can encode: {value!r}"
        ) from None
    return value
