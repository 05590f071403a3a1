"""``Limit``: a count over a period, parsed from strings such as ``"20/minute"``."""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field

from ratekeeper.errors import InvalidLimit

__all__ = [
    "ACCEPTED_FORMS",
    "DURATION_FORMS",
    "MAX_COUNT",
    "UNITS_SHOWN",
    "Limit",
    "never_admitted",
    "parse_duration",
]

_US_PER_UNIT: dict[str, int] = {}
for _names, _us in (
    (("us", "µs", "usec", "microsecond", "microseconds"), 1),
    (("ms", "msec", "millisecond", "milliseconds"), 1_000),
    (("s", "sec", "secs", "second", "seconds"), 1_000_000),
    (("m", "min", "mins", "minute", "minutes"), 60_000_000),
    (("h", "hr", "hrs", "hour", "hours"), 3_600_000_000),
    (("d", "day", "days"), 86_400_000_000),
    # The Envoy form's longer units, with its lengths: a month is 30 days, a year 365.
    (("w", "wk", "week", "weeks"), 7 * 86_400_000_000),
    (("month", "months"), 30 * 86_400_000_000),
    (("y", "yr", "year", "years"), 365 * 86_400_000_000),
):
    for _name in _names:
        _US_PER_UNIT[_name] = _us

UNITS_SHOWN = "us, ms, s, second, m, min, minute, h, hour, d, day, w, week, month, y, year"
"""The units as messages and docs list them (each also takes its plural; a month is 30
days and a year 365, as in the Envoy form)."""

ACCEPTED_FORMS = (
    '"20/minute", "5/3s", "10/100ms", "10/2.5min", "600 per 10 minutes", "1/week" '
    "(count, then '/' or 'per', then an optional amount, whole or decimal, and a unit: "
    f"{UNITS_SHOWN})"
)

DURATION_FORMS = (
    f'"3s", "100ms", "1.5s", "10 minutes", "minute" (an optional amount, whole or decimal, then a unit: {UNITS_SHOWN})'
)

_LIMIT_RE = re.compile(
    r"^\s*(?P<count>\d+)\s*(?:/|\s+per\s+)\s*(?P<amount>\d+(?:\.\d+)?)?\s*(?P<unit>[a-zµ]+)\s*$",
    re.IGNORECASE | re.ASCII,  # ASCII digits only: "٣/s" is not a limit
)
_DURATION_RE = re.compile(r"^\s*(?P<amount>\d+(?:\.\d+)?)?\s*(?P<unit>[a-zµ]+)\s*$", re.IGNORECASE | re.ASCII)

MAX_PERIOD_US = 10 * 366 * 86_400_000_000  # ten years: keeps every derived time below 2**53
MAX_COUNT = 1 << 50
"""The largest count (and burst) of a limit: every store decides it exactly, for every
algorithm (Lua numbers are doubles, exact below 2**53, and a count, what was counted and a
cost are added together). The bucket algorithms bound ``capacity x period / count`` too."""


def _unit_us(unit: str, text: str, forms: str) -> int:
    try:
        return _US_PER_UNIT[unit.lower()]
    except KeyError:
        close = difflib.get_close_matches(unit.lower(), _US_PER_UNIT, n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]!r}? Accepted" if close else "; accepted"
        raise InvalidLimit(f"unknown time unit {unit!r} in {text!r}{hint} forms: {forms}") from None


def _amount_us(amount: str | None, unit: str, text: str, forms: str = ACCEPTED_FORMS) -> int:
    per_unit = _unit_us(unit, text, forms)
    value = float(amount) * per_unit if amount is not None else float(per_unit)
    us = round(value)
    if us <= 0 or abs(value - us) > 1e-6:
        raise InvalidLimit(f"period in {text!r} must be a positive whole number of microseconds")
    return us


def parse_duration(text: str) -> int:
    """Parse ``"3s"``, ``"100ms"``, ``"10 minutes"`` or ``"minute"`` into microseconds."""
    m = _DURATION_RE.match(text)
    if not m:
        raise InvalidLimit(f"cannot parse duration {text!r}; accepted forms: {DURATION_FORMS}")
    return _amount_us(m.group("amount"), m.group("unit"), text, DURATION_FORMS)


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``count`` units of cost per ``period`` seconds.

    ``burst`` is the capacity of a token bucket, the tolerance of GCRA (in requests) and
    the queue size of a leaky bucket; it defaults to ``count``. For ``concurrency`` rules
    ``count`` is the number of leases in flight and ``period`` the lease lifetime.
    """

    count: int
    period: float = field(default=1.0)
    burst: int | None = None
    period_us: int = field(init=False, repr=False, compare=False)
    _text: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if type(self.count) is not int or self.count < 1:
            raise InvalidLimit(f"a limit's count must be a positive integer, got {self.count!r}")
        if self.count > MAX_COUNT:
            raise InvalidLimit(
                f"a limit's count may be at most 2**50 ({MAX_COUNT}), the largest every store decides "
                f"exactly, got {self.count}"
            )
        period = self.period
        if isinstance(period, bool) or not isinstance(period, int | float) or not math.isfinite(period):
            raise InvalidLimit(f"a limit's period must be a positive number of seconds, got {period!r}")
        period_us = round(period * 1_000_000)
        if period_us < 1 or abs(period * 1_000_000 - period_us) > 1e-3:
            raise InvalidLimit(
                f"a limit's period must be a positive whole number of microseconds, got {period!r} seconds"
            )
        if period_us > MAX_PERIOD_US:
            raise InvalidLimit(f"a limit's period may be at most ten years, got {period!r} seconds")
        if self.burst is not None and (type(self.burst) is not int or self.burst < 1):
            raise InvalidLimit(f"a limit's burst must be a positive integer, got {self.burst!r}")
        if self.burst is not None and self.burst > MAX_COUNT:
            raise InvalidLimit(
                f"a limit's burst may be at most 2**50 ({MAX_COUNT}), the largest every store decides "
                f"exactly, got {self.burst}"
            )
        object.__setattr__(self, "period_us", period_us)

    @classmethod
    def parse(cls, text: str | Limit, burst: int | None = None) -> Limit:
        """Parse one limit: ``"20/minute"``, ``"5/3s"``, ``"10/100ms"``, ``"600 per 10 minutes"``."""
        if isinstance(text, Limit):
            return text if burst is None or text.burst is not None else cls.from_us(text.count, text.period_us, burst)
        if not isinstance(text, str):
            raise InvalidLimit(
                f"a limit must be a string or a Limit, got {type(text).__name__}; accepted forms: {ACCEPTED_FORMS}"
            )
        m = _LIMIT_RE.match(text)
        if not m:
            raise InvalidLimit(f"cannot parse limit {text!r}; accepted forms: {ACCEPTED_FORMS}")
        count = int(m.group("count"))
        if count < 1:
            raise InvalidLimit(f"the count of limit {text!r} must be at least 1")
        period_us = _amount_us(m.group("amount"), m.group("unit"), text)
        return cls.from_us(count, period_us, burst)

    @classmethod
    def from_us(cls, count: int, period_us: int, burst: int | None = None) -> Limit:
        return cls(count, period_us / 1_000_000, burst)

    @property
    def capacity(self) -> int:
        """The largest cost one request may have: ``burst`` if set, else ``count``."""
        return self.count if self.burst is None else self.burst

    def __str__(self) -> str:
        try:
            return self._text
        except AttributeError:  # written once: every decision's as_dict and header spells it
            text = f"{self.count}/{_format_period(self.period_us)}"
            text = text if self.burst is None else f"{text} (burst {self.burst})"
            object.__setattr__(self, "_text", text)
            return text


def never_admitted(cost: int | None, limit: Limit) -> str:
    """Why a cost above a limit's capacity is refused for good:
    ``"cost 21 can never be admitted by 20/minute (capacity 20)"``."""
    what = "this cost" if cost is None else f"cost {cost}"
    return f"{what} can never be admitted by {limit} (capacity {limit.capacity})"


def _format_period(us: int) -> str:
    units = (
        ("day", "d", 86_400_000_000),
        ("hour", "h", 3_600_000_000),
        ("minute", "min", 60_000_000),
        ("second", "s", 1_000_000),
        ("ms", "ms", 1_000),
    )
    for word, short, size in units:
        if us % size == 0:
            n = us // size
            return word if n == 1 and word != "ms" else f"{n}{short}"
    return f"{us}us"
