"""ratekeeper: exact rate limits for one process or a fleet.

::

    from ratekeeper import Limiter, Rule

    limiter = Limiter("memory://")
    rule = Rule("auth.create_token", ["20/minute", "5/3s"], algorithm="sliding_window_log")
    if limiter.try_acquire(rule, "user-42"):
        ...
"""

from __future__ import annotations

from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.clock import Clock, SystemClock
from ratekeeper.decision import BatchDecision, Decision, LimitStats
from ratekeeper.errors import (
    ConfigurationError,
    InvalidLimit,
    InvalidRequest,
    LeaseError,
    RateKeeperError,
    RateLimitExceeded,
    StoreError,
    StoreTimeout,
)
from ratekeeper.limit import Limit
from ratekeeper.limiter.limiter import Lease, Limiter
from ratekeeper.limiter.limiter_async import AsyncLease, AsyncLimiter
from ratekeeper.limiter.observer import Observer
from ratekeeper.op import Op
from ratekeeper.quota import UNLIMITED, Quota
from ratekeeper.rule import MAX_KEY_LENGTH, Rule
from ratekeeper.stores.memory import MemoryStore

__all__ = [
    "ALGORITHMS",
    "MAX_KEY_LENGTH",
    "UNLIMITED",
    "AsyncLease",
    "AsyncLimiter",
    "BatchDecision",
    "Clock",
    "ConfigurationError",
    "Decision",
    "InvalidLimit",
    "InvalidRequest",
    "Lease",
    "LeaseError",
    "Limit",
    "LimitStats",
    "Limiter",
    "MemoryStore",
    "Observer",
    "Op",
    "Quota",
    "RateKeeperError",
    "RateLimitExceeded",
    "Rule",
    "StoreError",
    "StoreTimeout",
    "SystemClock",
]

__version__ = "0.1.0"
