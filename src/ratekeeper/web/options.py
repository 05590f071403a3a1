"""The web core's options read once, when it is built: costs, exempt keys, a custom denial."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ratekeeper.config.model import KeyTemplate
from ratekeeper.decision import Decision
from ratekeeper.errors import ConfigurationError
from ratekeeper.limit import MAX_COUNT

__all__ = [
    "HEADER_NAME",
    "MISSING_COST",
    "CostOption",
    "DenyResponse",
    "as_cost",
    "cost_option",
    "custom_denial",
    "parse_exempt_keys",
    "strings",
]

CostOption = int | str | KeyTemplate | Callable[..., int | None]
"""A ``cost`` option: a constant, a key template, or a callable."""

DenyResponse = Callable[[Sequence[Decision]], tuple[int, Iterable[tuple[str | bytes, str | bytes]], bytes | str]]
"""A ``deny_response`` option: ``callable(denied_decisions) -> (status, headers, body)``."""

log = logging.getLogger("ratekeeper.web")


MISSING_COST = 1
"""What a request is charged when its cost template cannot be read from it."""


def as_cost(value: object) -> int | None:
    """A cost from a constant, a rendered template or a callable's answer; None if not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return min(value, MAX_COUNT) if value >= 0 else None
    if isinstance(value, str):
        # ASCII digits only: str.isdigit() also accepts superscripts and other scripts'
        # digits, some of which int() refuses. A cost beyond every limit is one that no
        # limit admits, so it is capped where stores stop accepting costs.
        text = value.strip()
        return min(int(text), MAX_COUNT) if text.isascii() and text.isdigit() and len(text) <= 18 else None
    return None


def cost_option(cost: Any) -> Any:
    if cost is None or (callable(cost) and not isinstance(cost, KeyTemplate)):
        return cost
    if isinstance(cost, Mapping):
        return {name: _cost_value(value, f"cost[{name!r}]") for name, value in cost.items()}
    return _cost_value(cost, "cost")


def _cost_value(value: Any, where: str) -> Any:
    if callable(value) and not isinstance(value, KeyTemplate):
        return value
    if isinstance(value, str):
        return KeyTemplate.parse(value)
    if isinstance(value, KeyTemplate) or (type(value) is int and value >= 0):
        return value
    raise ConfigurationError(
        f"{where} must be a non-negative int, a template such as '{{header.x-cost}}' or a callable, got {value!r}"
    )


def parse_exempt_keys(
    option: Mapping[str, Iterable[str] | str] | Iterable[str],
) -> tuple[dict[str, frozenset[str]], tuple[tuple[KeyTemplate, frozenset[str]], ...]]:
    """``exempt_keys`` as (rule name -> its exempt keys, (template, exempting values) pairs).

    A key is exempt only where it was meant to be: a bare list of keys, compared with
    every rule's key, would exempt a client that sends the exempt value in a header some
    other rule is keyed by."""
    if not isinstance(option, Mapping):
        items = strings(option, "exempt_keys")
        if items:
            raise ConfigurationError(
                "exempt_keys must say what each key is exempt from: a mapping of a rule name to that rule's "
                "exempt keys, or of a key template to the values that exempt a request from every rule, e.g. "
                "{'api.per_key': ['monitoring-key'], '{client_ip}': ['10.0.0.5']}; "
                f"got the bare keys {items!r:.200}"
            )
        return {}, ()
    by_rule: dict[str, frozenset[str]] = {}
    parts: list[tuple[KeyTemplate, frozenset[str]]] = []
    for name, values in option.items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"exempt_keys: {name!r} is not a rule name or a key template such as '{{user}}'")
        keys = frozenset(strings(values, f"exempt_keys[{name!r}]"))
        if "{" in name or "}" in name:
            parts.append((KeyTemplate.parse(name), keys))
        else:
            by_rule[name] = keys
    return by_rule, tuple(parts)


def custom_denial(
    deny_response: DenyResponse, denied: Sequence[Decision]
) -> tuple[int, list[tuple[str, str]], bytes] | None:
    """What ``deny_response`` answered, as a status, str header pairs and a body; None
    (logged) when that is not a response a server could send: the request is still
    refused, with the standard 429, rather than turned into an error page."""
    try:
        status, extra, body = deny_response(denied)
        if type(status) is not int or not 100 <= status <= 599:
            raise ValueError(f"the status must be an int from 100 to 599, got {status!r}")
        headers = [(_header_text(name, "name"), _header_text(value, "value")) for name, value in extra]
        for name, _ in headers:
            if not name or not HEADER_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a header name")
        if isinstance(body, str):
            body = body.encode()
        if not isinstance(body, bytes | bytearray):
            raise ValueError(f"the body must be bytes or str, got {type(body).__name__}")
    except Exception:
        log.exception("ratekeeper: deny_response did not answer (status, [(name, value), ...], body); sent the 429")
        return None
    return status, headers, bytes(body)


HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP field name: RFC 9110 §5.1, a ``token`` (§5.6.2); ``fullmatch`` it."""


def _header_text(value: object, what: str) -> str:
    """A header name or value as the str every integration sends (bytes as latin-1)."""
    if isinstance(value, bytes | bytearray):
        text = bytes(value).decode("latin-1")
    elif isinstance(value, str):
        text = value
    else:
        raise ValueError(f"a header {what} must be str or bytes, got {type(value).__name__}")
    if any((ch < " " and ch != "\t") or ch == "\x7f" for ch in text):
        raise ValueError(f"the header {what} {text!r:.80} holds a control character (a line break, NUL, ...)")
    try:
        text.encode("latin-1")
    except UnicodeEncodeError as exc:
        raise ValueError(f"the header {what} {text!r:.80} is not latin-1 text") from exc
    return text


def strings(values: Iterable[str] | str, what: str) -> list[str]:
    items = [values] if isinstance(values, str) else list(values)
    for v in items:
        if not isinstance(v, str):
            raise ConfigurationError(f"{what} must be strings, got {v!r}")
    return items
