"""The service store's failures, named: httpx's exceptions become ours (``unreachable``),
and which of ours say the service is down (``store_down``)."""

from __future__ import annotations

from typing import Any

from ratekeeper.errors import StoreError, StoreTimeout

__all__ = ["reason", "store_down", "unreachable"]


def unreachable(exc: Any, base_url: str, timeout: float, what: str) -> StoreError:
    """Our exception for an httpx one (raised ``from reason(exc)``): ``StoreTimeout`` when
    the service did not answer in time, else ``StoreError``."""
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return StoreTimeout(f"the ratekeeper service at {base_url} did not answer {what} within {timeout:g} s")
    return StoreError(f"the ratekeeper service at {base_url} is unreachable ({what}): {exc}")


def reason(exc: Any) -> BaseException:
    """What an httpx exception's translation is chained to: a timeout itself; else the
    ``OSError`` underneath (one made of its message when there is none), which
    ``store_down`` looks for."""
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return exc
    return exc.__context__ if isinstance(exc.__context__, OSError) else OSError(str(exc))


def store_down(exc: BaseException) -> bool:
    """Whether ``exc`` says the service timed out or is unreachable (the callers queued
    behind the call that found it so get its error at once)."""
    return isinstance(exc, StoreTimeout) or (isinstance(exc, StoreError) and isinstance(exc.__cause__, OSError))
