"""``BoundedCache``: what clients may create, kept to a bound, least recently used first.

A client of the service can name things the service must remember: an Envoy ``limit``
override makes a rule, a store-API call sends rules of its own. Each such table is a
``BoundedCache``: at most ``bound`` entries, the least recently used one evicted to make
room for a new one, and the evictions counted so the metrics can show a client churning
through the bound. One event loop or one lock per cache: it is not thread-safe by itself.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["BoundedCache"]

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """At most ``bound`` entries; ``get`` makes a missing one with ``make`` and may evict.

    ``on_evict(key, value)`` is called for each entry evicted (e.g. to drop the state a
    store keeps for an evicted rule).
    """

    __slots__ = ("_entries", "bound", "evictions", "name", "on_evict")

    def __init__(self, bound: int, name: str = "", on_evict: Callable[[K, V], None] | None = None) -> None:
        if bound < 1:
            raise ValueError(f"a cache bound is at least 1, got {bound}")
        self.bound = bound
        self.name = name
        self.on_evict = on_evict
        self.evictions = 0
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The entry of ``key`` (now the most recently used), made by ``make`` if missing."""
        entries = self._entries
        try:
            value = entries[key]
        except KeyError:
            value = make()
            entries[key] = value
            while len(entries) > self.bound:
                old_key, old_value = entries.popitem(last=False)
                self.evictions += 1
                if self.on_evict is not None:
                    self.on_evict(old_key, old_value)
            return value
        entries.move_to_end(key)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
