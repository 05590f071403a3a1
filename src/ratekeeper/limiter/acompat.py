"""The primitives whose blocking and asyncio forms differ by more than ``async``/``await``
(psycopg's ``_acompat``): a ``*_async.py`` source calls the asyncio form, and
``tools/unasync.py`` renames it to the blocking one in the generated twin."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["agather", "gather"]

T = TypeVar("T")


async def agather(*calls: Awaitable[T]) -> list[T]:
    """The answers of ``calls``, run concurrently (a lone call is awaited as it is)."""
    if len(calls) == 1:
        return [await calls[0]]
    return list(await asyncio.gather(*calls))


def gather(*answers: T) -> list[T]:
    """The blocking form of ``agather``: the calls have already run, one after the other."""
    return list(answers)
