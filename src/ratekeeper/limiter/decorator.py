"""``limiter.limit(rule, key=...)``: charge each call of a function to a rule."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ratekeeper.errors import ConfigurationError, RateLimitExceeded
from ratekeeper.limiter.checks import check_timeout

if TYPE_CHECKING:
    from ratekeeper.decision import Decision

__all__ = ["limit_decorator"]

F = TypeVar("F", bound=Callable[..., Any])


def _resolver(value: Any) -> Callable[..., Any]:
    if callable(value):
        return value  # type: ignore[no-any-return]
    return lambda *args, **kwargs: value


def _decides_in_process(limiter: Any) -> bool:
    from ratekeeper.stores.url import in_process_decide

    store = getattr(limiter.store, "store", limiter.store)  # under an ObservedStore
    return in_process_decide(store) is not None


def limit_decorator(
    limiter: Any,
    rule: Any,
    key: str | Callable[..., str],
    cost: int | Callable[..., int],
    wait: float | None,
) -> Callable[[F], F]:
    from ratekeeper.rule import Rule

    if not isinstance(rule, Rule):
        raise ConfigurationError(f"limit() needs a Rule, got {rule!r}")
    check_timeout(wait)
    key_of = _resolver(key)
    cost_of = _resolver(cost)

    # An AsyncLimiter's methods are coroutine functions; a Limiter's block.
    is_async_limiter = inspect.iscoroutinefunction(limiter.try_acquire)

    def decorate(func: F) -> F:
        is_coroutine = inspect.iscoroutinefunction(func)
        if is_async_limiter and not is_coroutine:
            raise ConfigurationError(
                f"AsyncLimiter.limit decorates async functions; {func.__qualname__} is not one "
                "(use Limiter.limit for plain functions)"
            )
        if is_coroutine and not is_async_limiter and (wait is not None or not _decides_in_process(limiter)):
            # Limiter's calls block (store I/O, acquire's sleep): inside a coroutine they
            # would stall the event loop. Only a try_acquire on the memory store, which
            # never waits, is safe there.
            why = "waits with a blocking sleep" if wait is not None else "blocks on its store's I/O"
            raise ConfigurationError(
                f"Limiter.limit on the coroutine function {func.__qualname__} {why}, which would stall "
                "the event loop: decorate it with an AsyncLimiter's limit instead "
                "(AsyncLimiter(store, on_error=...).limit(...))"
            )

        def settle(decision: Decision, cost: int) -> None:
            if not decision.allowed:
                raise RateLimitExceeded(decision, cost=cost)

        if is_async_limiter:

            @functools.wraps(func)
            async def async_limited(*args: Any, **kwargs: Any) -> Any:
                k, c = key_of(*args, **kwargs), cost_of(*args, **kwargs)
                if wait is None:
                    settle(await limiter.try_acquire(rule, k, c), c)
                else:
                    await limiter.acquire(rule, k, c, timeout=wait)
                return await func(*args, **kwargs)

            return async_limited  # type: ignore[return-value]

        def charge(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            k, c = key_of(*args, **kwargs), cost_of(*args, **kwargs)
            if wait is None:
                settle(limiter.try_acquire(rule, k, c), c)
            else:
                limiter.acquire(rule, k, c, timeout=wait)

        if is_coroutine:  # a memory-store Limiter without wait: deciding never blocks

            @functools.wraps(func)
            async def limited_coroutine(*args: Any, **kwargs: Any) -> Any:
                charge(args, kwargs)
                return await func(*args, **kwargs)

            return limited_coroutine  # type: ignore[return-value]

        @functools.wraps(func)
        def limited(*args: Any, **kwargs: Any) -> Any:
            charge(args, kwargs)
            return func(*args, **kwargs)

        return limited  # type: ignore[return-value]

    return decorate
