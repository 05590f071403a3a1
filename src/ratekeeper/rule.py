"""``Rule``: a name, one or more limits, one algorithm."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import ConfigurationError
from ratekeeper.keys import MAX_KEY_LENGTH
from ratekeeper.limit import Limit

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Algorithm, Plan
    from ratekeeper.quota import Quota

__all__ = ["DEFAULT_ALGORITHM", "MAX_KEY_LENGTH", "POLICIES", "Rule", "check_policy"]

DEFAULT_ALGORITHM = "gcra"

POLICIES = ("allow", "deny", "local", "raise")
"""The values of ``on_error`` (a limiter's, or a rule's override; ``ratekeeper.limiter.failure``)."""


def check_policy(value: object, where: str) -> str:
    """``value`` if it names a failure policy, else a ``ConfigurationError`` listing them."""
    if type(value) is not str or value not in POLICIES:
        raise ConfigurationError(f"{where}: on_error must be one of {', '.join(map(repr, POLICIES))}, got {value!r}")
    return value


class Rule:
    """A named set of limits enforced together by one algorithm (an immutable value).

    All limits of a rule are checked and charged as one transaction: either every limit
    admits the cost and all are charged, or none is. ``burst`` gives every limit without a
    burst of its own that burst (token bucket, GCRA and leaky bucket only). ``quota``
    makes the limits per key, fetched from a provider; ``limits`` is then the failsafe
    used until the provider's first answer. ``on_error`` overrides the limiter's failure
    policy for this rule (``"allow"``, ``"deny"``, ``"local"`` or ``"raise"``; see
    ``ratekeeper.limiter.failure``); None uses the limiter's.

    Two rules are equal when their name, limits, algorithm and ``on_error`` are; the hash
    leaves ``on_error`` out (equal rules still hash alike).
    """

    __slots__ = ("_hash", "_plan", "_plans", "algorithm", "burst", "limits", "name", "on_error", "quota")

    name: str
    limits: tuple[Limit, ...]
    algorithm: str
    burst: int | None
    quota: Quota | None
    on_error: str | None
    _plan: Plan
    _plans: dict[tuple[Limit, ...], Plan]
    _hash: int

    def __init__(
        self,
        name: str,
        limits: Iterable[Limit | str] | str | Limit,
        algorithm: str = DEFAULT_ALGORITHM,
        *,
        burst: int | None = None,
        quota: Quota | None = None,
        on_error: str | None = None,
    ) -> None:
        from ratekeeper.algorithms import get_algorithm

        if not isinstance(name, str) or not name.strip():
            raise ConfigurationError(f"a rule needs a non-empty name, got {name!r}")
        if not name.isascii():
            try:
                name.encode()
            except UnicodeEncodeError as exc:
                raise ConfigurationError(
                    f"rule name {name!r} holds a lone surrogate at index {exc.start}, which no store can encode"
                ) from None
        if isinstance(limits, str | Limit):
            items: list[Any] = [limits]
        elif isinstance(limits, Iterable):
            items = list(limits)
        else:
            raise ConfigurationError(
                f"rule {name!r}: limits must be a limit string, a Limit or a list of them, got {limits!r}"
            )
        if not items:
            raise ConfigurationError(f"rule {name!r} has no limits; give at least one, e.g. limits=['20/minute']")
        if burst is not None and (type(burst) is not int or burst < 1):
            raise ConfigurationError(f"rule {name!r}: burst must be a positive integer, got {burst!r}")
        if on_error is not None:
            check_policy(on_error, f"rule {name!r}")
        parsed = tuple(Limit.parse(item, burst) for item in items)
        algo = get_algorithm(algorithm)
        set_ = object.__setattr__
        set_(self, "name", name)
        set_(self, "limits", parsed)
        set_(self, "algorithm", algo.name)
        set_(self, "burst", burst)
        set_(self, "quota", quota)
        set_(self, "on_error", on_error)
        set_(self, "_plan", algo.plan(name, parsed))
        set_(self, "_plans", {})
        set_(self, "_hash", hash((name, parsed, algo.name)))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Rule is immutable; build a new Rule instead of setting {name!r}")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Rule):
            return NotImplemented
        return (self.name, self.limits, self.algorithm, self.on_error) == (
            other.name,
            other.limits,
            other.algorithm,
            other.on_error,
        )

    @property
    def algo(self) -> Algorithm:
        return self._plan.algorithm

    @property
    def plan(self) -> Plan:
        return self._plan

    def plan_for(self, limits: tuple[Limit, ...]) -> Plan:
        """The plan for other limits under this rule's algorithm (dynamic quotas), reused per limits."""
        if limits == self.limits:
            return self._plan
        plan = self._plans.get(limits)
        if plan is None:
            plan = self._plan.algorithm.plan(self.name, limits)
            if len(self._plans) >= 1024:  # quota tiers are few; a bound all the same
                self._plans.clear()
            self._plans[limits] = plan
        return plan

    def __repr__(self) -> str:
        on_error = "" if self.on_error is None else f", on_error={self.on_error!r}"
        return f"Rule({self.name!r}, limits={[str(x) for x in self.limits]!r}, algorithm={self.algorithm!r}{on_error})"

    def __str__(self) -> str:
        return f"{self.name} [{', '.join(map(str, self.limits))}] ({self.algorithm})"
