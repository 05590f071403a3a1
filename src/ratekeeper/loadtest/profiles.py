"""Load profiles: what each stream of requests sends, at which rate, and the limit it
expects to meet; read from YAML or built in code."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ratekeeper.limit import Limit

__all__ = ["Plan", "Profile", "Stage", "load_plan", "parse_duration", "parse_rate"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """Seconds from ``60``, ``"60s"``, ``"3m"``, ``"500ms"``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"not a duration: {value!r} (e.g. 60s, 3m, 500ms)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"a duration must be positive: {value!r}")
    return seconds


def parse_rate(value: Any) -> float:
    """Requests per second from ``200``, ``"200/s"``, ``"600/minute"``, ``"5/3s"``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        rate = float(value)
    elif "/" in str(value):
        limit = Limit.parse(str(value))
        rate = limit.count / limit.period
    else:
        rate = float(str(value))
    if rate <= 0:
        raise ValueError(f"a rate must be positive: {value!r}")
    return rate


@dataclass(frozen=True, slots=True)
class Stage:
    """``rate`` requests per second for ``seconds``."""

    rate: float
    seconds: float


@dataclass(frozen=True, slots=True)
class Profile:
    """One stream of requests. Header values and the path may hold ``{n}``: the request's
    number in the profile, so ``"invalid-{n}@example.com"`` is a new id each request."""

    name: str
    stages: tuple[Stage, ...]
    path: str = "/"
    method: str = "GET"
    headers: dict[str, str] = field(default_factory=dict)
    expect: Limit | None = None
    poisson: bool = False
    control: bool = False
    """The control: traffic that bypasses the limiter, the latency the others are read against."""

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    @property
    def planned(self) -> int:
        return sum(round(s.rate * s.seconds) for s in self.stages)

    def bound(self, span: float) -> int | None:
        """The most ``expect`` can admit in ``span`` seconds: its whole count at once, then
        its rate (``n + floor(span * n / period)``). It holds for gcra, token_bucket and
        sliding_window_log with the default burst (a burst above the count, or a fixed
        window, which can admit ``2n`` across a boundary, need a larger bound)."""
        if self.expect is None:
            return None
        n = self.expect.count
        return n + math.floor(span * n / self.expect.period + 1e-9)

    def render(self, template: str, n: int) -> str:
        return template.replace("{n}", str(n)) if "{n}" in template else template


@dataclass(frozen=True, slots=True)
class Plan:
    """What a run sends, and where."""

    target: str
    profiles: tuple[Profile, ...]
    timeout: float = 5.0
    """Seconds one request may take before it counts as an error."""

    @property
    def seconds(self) -> float:
        return max((p.seconds for p in self.profiles), default=0.0)


def _stages(spec: dict[str, Any], duration: float | None) -> tuple[Stage, ...]:
    if "stages" in spec:
        raw = spec["stages"]
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"profile {spec.get('name')!r}: stages must be a non-empty list")
        return tuple(Stage(parse_rate(s["rate"]), parse_duration(s["for"])) for s in raw)
    if "rate" not in spec:
        raise ValueError(f"profile {spec.get('name')!r}: needs a rate or stages")
    seconds = parse_duration(spec["for"]) if "for" in spec else duration
    if seconds is None:
        raise ValueError(f"profile {spec.get('name')!r}: needs a duration (the file's or its own `for`)")
    return (Stage(parse_rate(spec["rate"]), seconds),)


def profile_from(spec: dict[str, Any], duration: float | None = None) -> Profile:
    """A profile from one YAML mapping."""
    if not isinstance(spec, dict) or not spec.get("name"):
        raise ValueError(f"a profile needs a name: {spec!r}")
    known = {"name", "rate", "stages", "for", "path", "method", "headers", "expect", "poisson", "control"}
    unknown = set(spec) - known
    if unknown:
        raise ValueError(f"profile {spec['name']!r}: unknown fields {sorted(unknown)}")
    expect = spec.get("expect")
    return Profile(
        name=str(spec["name"]),
        stages=_stages(spec, duration),
        path=str(spec.get("path", "/")),
        method=str(spec.get("method", "GET")).upper(),
        headers={str(k): str(v) for k, v in (spec.get("headers") or {}).items()},
        expect=Limit.parse(str(expect)) if expect is not None else None,
        poisson=bool(spec.get("poisson", False)),
        control=bool(spec.get("control", False)),
    )


def plan_from(data: dict[str, Any], target: str | None = None, duration: float | None = None) -> Plan:
    """A plan from a parsed YAML document; ``target`` and ``duration`` override the file's."""
    if not isinstance(data, dict):
        raise ValueError("a loadtest file is a mapping with target, duration and profiles")
    where = target or data.get("target")
    if not where:
        raise ValueError("no target: give one in the file or with --target")
    seconds = duration or (parse_duration(data["duration"]) if "duration" in data else None)
    profiles = data.get("profiles")
    if not isinstance(profiles, list) or not profiles:
        raise ValueError("profiles must be a non-empty list")
    built = tuple(profile_from(p, seconds) for p in profiles)
    names = [p.name for p in built]
    if len(set(names)) != len(names):
        raise ValueError(f"profile names must be unique: {names}")
    timeout = parse_duration(data["timeout"]) if "timeout" in data else 5.0
    return Plan(str(where).rstrip("/"), built, timeout)


def load_plan(path: Path, target: str | None = None, duration: float | None = None) -> Plan:
    import yaml

    return plan_from(yaml.safe_load(path.read_text()), target, duration)
