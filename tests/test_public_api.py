"""The public surface changes only on purpose."""

from __future__ import annotations

import ratekeeper


def test_exported_names_are_pinned() -> None:
    """``ratekeeper.__all__`` is exactly this list; change both together."""
    expected = [
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
    assert expected == ratekeeper.__all__
    for name in expected:
        assert hasattr(ratekeeper, name), name


def test_the_seven_algorithms_are_registered() -> None:
    """DESIGN §2 names seven algorithms; each is available by name."""
    expected = {
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
        "token_bucket",
        "gcra",
        "leaky_bucket",
        "concurrency",
    }
    assert expected == set(ratekeeper.ALGORITHMS)


def test_package_is_typed() -> None:
    """The package ships ``py.typed`` so users' type checkers read its annotations."""
    from importlib.resources import files

    assert files("ratekeeper").joinpath("py.typed").is_file()


def test_error_tree() -> None:
    """Every error is a RateKeeperError; argument errors are also ValueErrors."""
    from ratekeeper import errors

    assert issubclass(errors.InvalidLimit, errors.ConfigurationError)
    assert issubclass(errors.ConfigurationError, ValueError)
    assert issubclass(errors.InvalidRequest, ValueError)
    assert issubclass(errors.StoreTimeout, errors.StoreError)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.RateKeeperError)
