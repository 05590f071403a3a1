"""Store URLs: which store a URL names, opened for a blocking or an asyncio limiter."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qsl, urlsplit

from ratekeeper.errors import ConfigurationError
from ratekeeper.stores.base import AsyncStore, InProcessAsync, InProcessStore, Store
from ratekeeper.stores.postgres.options import POSTGRES_SCHEMES
from ratekeeper.stores.redis.url import REDIS_SCHEMES
from ratekeeper.stores.service.options import SERVICE_SCHEMES

if TYPE_CHECKING:
    from ratekeeper.decision import Decision

__all__ = ["SCHEMES", "in_process_decide", "open_async_store", "open_store"]

SCHEMES = ("memory", *REDIS_SCHEMES, *POSTGRES_SCHEMES, *SERVICE_SCHEMES)
_PLANNED: tuple[str, ...] = ()


def _int_option(name: str, value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"store option {name} must be an integer, got {value!r}") from None


def open_store(url: str | Store, **options: Any) -> Store:
    """Open the store that ``url`` names; keyword options override URL query options.

    ``memory://?max_keys=100000&stripes=64``; ``clock=`` only as a keyword.
    """
    if not isinstance(url, str):
        if options:
            raise ConfigurationError(
                f"options {sorted(options)} apply to a store URL; configure the store object itself instead"
            )
        return url
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "memory":
        from ratekeeper.stores.memory import MemoryStore

        query: dict[str, Any] = dict(parse_qsl(parts.query))
        unknown = (set(query) - {"max_keys", "stripes"}) | (set(options) - {"max_keys", "stripes", "clock"})
        if unknown:
            raise ConfigurationError(
                f"unknown option(s) {sorted(unknown)} for memory://; accepted: max_keys, stripes "
                "(in the URL or as keywords) and clock (as a keyword)"
            )
        kwargs: dict[str, Any] = {k: _int_option(k, v) for k, v in query.items()}
        kwargs.update(options)
        return MemoryStore(**kwargs)
    if scheme in REDIS_SCHEMES:
        from ratekeeper.stores.redis.store import RedisStore

        return RedisStore(url, **options)
    if scheme in POSTGRES_SCHEMES:
        from ratekeeper.stores.postgres.store import PostgresStore

        return PostgresStore(url, **options)
    if scheme in SERVICE_SCHEMES:
        from ratekeeper.stores.service.store import ServiceStore

        return ServiceStore(url, **options)
    if scheme in _PLANNED:
        raise ConfigurationError(f"the {scheme}:// store is not part of this version yet; use memory://")
    raise ConfigurationError(
        f"unknown store URL {url!r}; expected one of {', '.join(s + '://' for s in SCHEMES)} (or a Store object)"
    )


def open_async_store(url: str | Store | AsyncStore, **options: Any) -> AsyncStore:
    """``open_store`` for ``AsyncLimiter``: a store without I/O (memory) runs on the loop directly."""
    if isinstance(url, str) and urlsplit(url).scheme.lower() in REDIS_SCHEMES:
        from ratekeeper.stores.redis.store_async import AsyncRedisStore

        return AsyncRedisStore(url, **options)
    if isinstance(url, str) and urlsplit(url).scheme.lower() in POSTGRES_SCHEMES:
        from ratekeeper.stores.postgres.store_async import AsyncPostgresStore

        return AsyncPostgresStore(url, **options)
    if isinstance(url, str) and urlsplit(url).scheme.lower() in SERVICE_SCHEMES:
        from ratekeeper.stores.service.store_async import AsyncServiceStore

        return AsyncServiceStore(url, **options)
    opened: Any = url if hasattr(url, "aclose") and not options else open_store(url, **options)  # type: ignore[arg-type]
    return opened if hasattr(opened, "aclose") else InProcessAsync(opened)


def in_process_decide(store: object) -> Callable[..., Decision] | None:
    """The ``decide_fields`` of ``store`` when it decides in this process without I/O (the
    memory store, or ``InProcessAsync`` over it), else None: the limiters' hot path."""
    inner = store.sync if isinstance(store, InProcessAsync) else store
    if getattr(inner, "in_process", False):
        return cast("InProcessStore", inner).decide_fields
    return None
