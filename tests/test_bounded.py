"""``BoundedCache``: a bound on what clients may create, least recently used evicted first."""

from __future__ import annotations

import pytest

from ratekeeper.bounded import BoundedCache


def test_the_least_recently_used_entry_is_evicted_and_counted() -> None:
    evicted: list[tuple[str, int]] = []
    cache: BoundedCache[str, int] = BoundedCache(2, on_evict=lambda k, v: evicted.append((k, v)))
    assert cache.get("a", lambda: 1) == 1
    assert cache.get("b", lambda: 2) == 2
    assert cache.get("a", lambda: 99) == 1  # a is now the most recently used
    assert cache.get("c", lambda: 3) == 3
    assert evicted == [("b", 2)]
    assert cache.evictions == 1
    assert len(cache) == 2
    assert "a" in cache and "c" in cache and "b" not in cache


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BoundedCache(0)
