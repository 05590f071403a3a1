"""The one exception tree of ratekeeper.

::

    RateKeeperError
    ├── ConfigurationError (also ValueError)   a rule, limit, URL or option is wrong
    │   └── InvalidLimit                        a limit string or value cannot be used
    ├── InvalidRequest (also ValueError)        a call's key or cost is wrong
    ├── RateLimitExceeded                       acquire() / a decorator was refused
    ├── LeaseError                              a Lease object is misused (entered twice)
    └── StoreError                              the store failed (the cause is chained)
        ├── StoreTimeout                        the store did not answer in time
        └── CircuitOpen                         not called: the circuit breaker is open

Every error says what is wrong and what would be right. Store errors are translated at
the store boundary to the most specific of these and chained with ``from exc``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ratekeeper.decision import Decision

__all__ = [
    "CircuitOpen",
    "ConfigurationError",
    "InvalidLimit",
    "InvalidRequest",
    "LeaseError",
    "RateKeeperError",
    "RateLimitExceeded",
    "StoreError",
    "StoreTimeout",
]


class RateKeeperError(Exception):
    """Base of every exception ratekeeper raises on purpose."""


class ConfigurationError(RateKeeperError, ValueError):
    """A rule, limit, store URL or option cannot be used as given."""


class InvalidLimit(ConfigurationError):
    """A limit string or value is malformed or out of range."""


class InvalidRequest(RateKeeperError, ValueError):
    """A call's arguments (key, cost, timeout) are not acceptable."""


class LeaseError(RateKeeperError):
    """A ``Lease`` is misused: entered while held, or its id asked before it was granted.

    Releasing a lease that has expired (or was released) is harmless and raises nothing."""


class StoreError(RateKeeperError):
    """The store could not decide (connection lost, script error, ...)."""


class StoreTimeout(StoreError):
    """The store did not answer within the configured timeout."""


class CircuitOpen(StoreError):
    """The store was not called: its circuit breaker is open after repeated failures.

    Raised in microseconds instead of waiting for a store known to be failing; the
    failure policy (``on_error``) then answers as for any other ``StoreError``.
    """


class RateLimitExceeded(RateKeeperError):
    """Raised by ``acquire`` and the decorators when a request is refused.

    ``decision`` holds the refusal (``retry_after``, ``denied_by``, per-limit stats).
    """

    def __init__(self, decision: Decision, message: str | None = None, *, cost: int | None = None) -> None:
        self.decision = decision
        if message is None:
            limit = decision.denied_by
            if limit is not None and math.isinf(decision.retry_after):
                from ratekeeper.limit import never_admitted  # limit.py imports this module

                message = f"{never_admitted(cost, limit)} of rule {decision.rule!r}"
            else:
                what = f"limit {limit}" if limit is not None else "limit"
                message = f"rate limited by {what} of rule {decision.rule!r}; retry after {decision.retry_after:.3f}s"
        super().__init__(message)

    @property
    def retry_after(self) -> float:
        return self.decision.retry_after
