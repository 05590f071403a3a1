"""The seven algorithms, by name."""

from __future__ import annotations

from ratekeeper.algorithms.base import Algorithm, Plan
from ratekeeper.algorithms.concurrency import Concurrency
from ratekeeper.algorithms.fixed_window import FixedWindow
from ratekeeper.algorithms.gcra import Gcra
from ratekeeper.algorithms.leaky_bucket import LeakyBucket
from ratekeeper.algorithms.sliding_window_counter import SlidingWindowCounter
from ratekeeper.algorithms.sliding_window_log import SlidingWindowLog
from ratekeeper.algorithms.token_bucket import TokenBucket
from ratekeeper.errors import ConfigurationError

__all__ = ["ALGORITHMS", "Algorithm", "Plan", "get_algorithm"]

ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        FixedWindow(),
        SlidingWindowLog(),
        SlidingWindowCounter(),
        TokenBucket(),
        Gcra(),
        LeakyBucket(),
        Concurrency(),
    )
}


def get_algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ConfigurationError(f"unknown algorithm {name!r}; choose one of: {', '.join(ALGORITHMS)}") from None
