"""Stores: where the state of each (rule, key) lives and where decisions are made."""

from __future__ import annotations

from ratekeeper.stores.base import Store
from ratekeeper.stores.memory import MemoryStore
from ratekeeper.stores.url import open_store

__all__ = ["MemoryStore", "Store", "open_store"]
