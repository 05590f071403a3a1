"""Limiters that tell a test each settlement they made (a charge or a refund after the
response), so the test reads the store only after it: the settlement runs on the
server's thread or loop, after the client already has its answer."""

from __future__ import annotations

import threading
from typing import Any

from ratekeeper import Rule
from ratekeeper.errors import StoreError
from ratekeeper.limiter.limiter import Limiter
from ratekeeper.limiter.limiter_async import AsyncLimiter

WAIT = 10.0  # bound of every wait: a settlement that never comes fails the test instead of blocking it


class _Settlements:
    """What both kinds share: the semaphore released per settlement, and ``fail``: every
    settlement raises a ``StoreError`` (the store went away after the decision)."""

    settled: threading.Semaphore
    fail: bool

    def _watch(self, fail: bool) -> None:
        self.settled = threading.Semaphore(0)
        self.fail = fail

    def _settling(self) -> None:
        if self.fail:
            raise StoreError("the store went away")

    def wait(self) -> None:
        assert self.settled.acquire(timeout=WAIT), "the response was not settled"


class WatchedLimiter(Limiter, _Settlements):
    def __init__(self, *args: Any, fail: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watch(fail)

    def charge(self, rule: Rule, key: str, cost: int, *, now: int | None = None) -> Any:
        try:
            self._settling()
            return super().charge(rule, key, cost, now=now)
        finally:
            self.settled.release()

    def refund(self, rule: Rule, key: str, cost: int = 1, *, lease_id: str | None = None) -> bool:
        try:
            self._settling()
            return super().refund(rule, key, cost, lease_id=lease_id)
        finally:
            self.settled.release()


class WatchedAsyncLimiter(AsyncLimiter, _Settlements):
    def __init__(self, *args: Any, fail: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watch(fail)

    async def charge(self, rule: Rule, key: str, cost: int, *, now: int | None = None) -> Any:
        try:
            self._settling()
            return await super().charge(rule, key, cost, now=now)
        finally:
            self.settled.release()

    async def refund(self, rule: Rule, key: str, cost: int = 1, *, lease_id: str | None = None) -> bool:
        try:
            self._settling()
            return await super().refund(rule, key, cost, lease_id=lease_id)
        finally:
            self.settled.release()
