"""``load_settled``: load a rules file only once it has stopped changing.

A file rewritten in place (truncated, then written) can be read half-written; a reload
that takes that half would drop rules, and a missing rule is no limit at all for the
middleware. So a file is loaded only when two looks ``settle`` seconds apart see the same
``(mtime_ns, size, inode)`` and the same bytes, and the loader's own read is bracketed:
the file must still have that signature once loaded. (A write after the first look moves
the mtime, since ``settle`` is far longer than the clock tick of file times.) A file
still moving after ``rounds`` tries raises ``Unsettled``: nothing was loaded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ratekeeper.config.yamlfile import MAX_FILE_BYTES
from ratekeeper.errors import ConfigurationError

__all__ = ["SETTLE", "Loaded", "Signature", "Unsettled", "load_settled", "signature"]

T = TypeVar("T")

SETTLE = 0.2
"""Seconds a file must stand still before it is loaded (editors and ``cp`` take milliseconds)."""

Signature = tuple[int, int, int]


class Unsettled(Exception):
    """The file kept changing while it was being looked at; try again later."""


@dataclass(frozen=True, slots=True)
class Loaded(Generic[T]):
    """What one load of a settled file gave: the rules, or the error (text) that refused it.

    ``signature`` is the file's as loaded (None when it could not even be looked at), so a
    caller can tell a later change from the content it already tried.
    """

    signature: Signature | None
    rules: T | None = None
    error: str | None = None


def signature(path: str) -> Signature | None:
    """``(mtime_ns, size, inode)`` of ``path``, or None when it cannot be looked at."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _look(path: str) -> tuple[Signature, bytes] | None:
    """The file's signature and bytes, or None when it changed during the read."""
    before = os.stat(path)
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    after = os.stat(path)
    sig = (after.st_mtime_ns, after.st_size, after.st_ino)
    if (before.st_mtime_ns, before.st_size, before.st_ino) != sig:
        return None
    return sig, data


def load_settled(path: str, loader: Callable[[str], T], settle: float = SETTLE, rounds: int = 1) -> Loaded[T]:
    """``loader(path)`` once the file has stood still for ``settle`` seconds.

    A file that cannot be read or fails to load is a ``Loaded`` with its ``error`` (the
    loader's ``ConfigurationError`` lists every problem); ``Unsettled`` when the file was
    still changing after ``rounds`` waits of ``settle`` seconds.
    """
    previous: tuple[Signature, bytes] | None = None
    for attempt in range(rounds + 1):
        if attempt:
            time.sleep(settle)
        try:
            look = _look(path)
            if look is None or look != previous:
                previous = look
                continue
            sig = look[0]
            try:
                rules = loader(path)
            except ConfigurationError as exc:
                error = str(exc)
            else:
                if signature(path) == sig:
                    return Loaded(sig, rules)
                previous = None  # written while the loader read it
                continue
            if signature(path) == sig:
                return Loaded(sig, error=error)
            previous = None
        except OSError as exc:
            return Loaded(signature(path), error=f"{path}: cannot read the rules file ({exc})")
    raise Unsettled(
        f"{path}: the file kept changing for {rounds * settle:g}s; it is loaded once it has stood still "
        f"for {settle:g}s (write it elsewhere and rename it into place to replace it at once)"
    )
