"""redis-py's errors, read: ours for theirs (``translate``), and what a failure says.

- ``store_errors``: what redis-py raises for a failed call;
- ``translate``: redis-py's exceptions become ours (``StoreTimeout``, ``StoreError``);
- ``store_down``: whether a failed call says Redis is down or timed out (the calls queued
  behind it then get its error at once);
- ``applied_nothing``: whether a failed call wrote nothing (its ops may be decided apart);
- ``not_run``, ``function_missing``, ``no_functions``: a refused call that did not run, for
  want of its script, of the library, or of Functions altogether.
"""

from __future__ import annotations

from ratekeeper.errors import StoreError, StoreTimeout
from ratekeeper.stores.redis.workarounds import BlockingPoolExhaustion

__all__ = [
    "NOT_APPLIED",
    "applied_nothing",
    "function_missing",
    "no_functions",
    "not_run",
    "store_down",
    "store_errors",
    "translate",
]

NOT_APPLIED = "ratekeeper: nothing applied: "
"""How ``main.lua`` starts the error of a call that failed before its first write."""


def store_errors() -> tuple[type[BaseException], ...]:
    """What redis-py raises for a failed call: its ``RedisError`` tree, the Cluster client's
    ``RedisClusterException`` tree (not a ``RedisError``), and ``OSError``."""
    import redis.exceptions as rexc

    return (rexc.RedisError, rexc.RedisClusterException, OSError)


def translate(exc: BaseException, what: str) -> StoreError:
    """Our exception for a redis-py one (the caller chains it with ``from exc``)."""
    import redis.exceptions as rexc

    if BlockingPoolExhaustion.matches(exc):
        return StoreTimeout(
            f"no connection to Redis was free for {what}: all max_connections are busy ({exc}); "
            "raise the store option max_connections, or lower the load"
        )
    if isinstance(exc, rexc.TimeoutError | TimeoutError):
        return StoreTimeout(f"Redis did not answer {what} in time: {exc}")
    if isinstance(exc, rexc.ConnectionError | OSError):
        return StoreError(f"Redis is unreachable for {what}: {exc}")
    return StoreError(f"Redis failed {what}: {exc}")


def store_down(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis timed out or is unreachable (not that one call was wrong,
    nor that this process ran out of connections): the calls queued behind the failed one
    get the same error instead of waiting their turn."""
    import redis.exceptions as rexc

    cause = exc.__cause__
    return (
        isinstance(exc, StoreError)
        and isinstance(cause, rexc.ConnectionError | rexc.TimeoutError | OSError)
        and not BlockingPoolExhaustion.matches(cause)
    )


def applied_nothing(exc: BaseException) -> bool:
    """Whether a failed call (``exc``, translated, redis-py's error chained) wrote nothing:
    the script failed before its writes (on one op's data: a key holding a value that is
    not its rule's state), so its ops may be decided again apart."""
    cause = exc.__cause__
    return isinstance(exc, StoreError) and cause is not None and str(cause).startswith(NOT_APPLIED)


def function_missing(exc: BaseException) -> bool:
    """Whether a refused ``FCALL`` says the server lacks the library (a restart without
    persistence, a failover to a node that never had it, a new Cluster node)."""
    return str(exc).startswith("Function not found")


def no_functions(exc: BaseException) -> bool:
    """Whether a refused ``FCALL`` or ``FUNCTION LOAD`` says this server (Redis < 7) or
    this user (an ACL) has no Functions: decisions then go by ``EVALSHA``."""
    import redis.exceptions as rexc

    text = str(exc).lower()
    if isinstance(exc, rexc.NoPermissionError):
        return "'fcall'" in text or "'function" in text
    return "unknown command" in text and ("fcall" in text or "function" in text)


def not_run(exc: BaseException) -> bool:
    """Whether a call refused with ``exc`` did not run, for want of its script or library
    (or of Functions altogether): sending it again cannot charge twice."""
    import redis.exceptions as rexc

    return isinstance(exc, rexc.NoScriptError) or function_missing(exc) or no_functions(exc)
