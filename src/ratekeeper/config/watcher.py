"""``RulesWatcher``: the rules of a file, reloaded when the file changes.

Readers call ``current`` on every request; it costs an attribute read, plus one
``os.stat`` at most once per ``interval`` of the injected clock. A changed file (its
``mtime_ns``, size, or inode: a file replaced by a rename, as editors and Kubernetes
ConfigMaps do) is loaded and swapped in by one attribute assignment, so a reader
sees the old rules or the new ones, never a mix. A file that fails to load is refused:
the old rules stay, every problem is logged to the ``ratekeeper`` logger, and the same
broken file is not retried until it changes again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from ratekeeper.config.envoy import EnvoyConfig
from ratekeeper.config.forms import load_any
from ratekeeper.config.model import RuleSet
from ratekeeper.errors import ConfigurationError

__all__ = ["RulesWatcher"]

log = logging.getLogger("ratekeeper")

T = TypeVar("T")
_Signature = tuple[int, int, int] | None


def _signature(path: str) -> _Signature:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class RulesWatcher(Generic[T]):
    """Loads ``path`` with ``loader`` now (raising on a bad file) and again when it changes.

    ``on_reload(ok, error)`` is called after every reload attempt (a metrics hook): ``ok``
    True with None, or False with the error text (every problem). ``reload()`` forces a
    load now (for SIGHUP) and returns whether it was taken.
    """

    @overload
    def __init__(
        self: RulesWatcher[RuleSet | EnvoyConfig],
        path: str | os.PathLike[str],
        *,
        interval: float = ...,
        clock: Callable[[], float] = ...,
        on_reload: Callable[[bool, str | None], None] | None = ...,
    ) -> None: ...

    @overload
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        loader: Callable[[str], T],
        interval: float = ...,
        clock: Callable[[], float] = ...,
        on_reload: Callable[[bool, str | None], None] | None = ...,
    ) -> None: ...

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        loader: Callable[[str], Any] = load_any,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        on_reload: Callable[[bool, str | None], None] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self._loader = loader
        self._interval = interval
        self._clock = clock
        self._on_reload = on_reload
        self._lock = threading.Lock()
        self._seen = _signature(self.path)
        self._current: T = loader(self.path)
        self._next_check = clock() + interval
        self.reloads = 0
        self.failures = 0

    @property
    def current(self) -> T:
        """The rules in force; checks the file first when ``interval`` has passed."""
        if self._clock() >= self._next_check and self._lock.acquire(blocking=False):
            # One reader checks; the others go on with the rules they have.
            try:
                self._next_check = self._clock() + self._interval
                signature = _signature(self.path)
                if signature != self._seen:
                    self._load(signature)
            finally:
                self._lock.release()
        return self._current

    def reload(self) -> bool:
        """Load the file now, changed or not; True when the new rules were taken."""
        with self._lock:
            return self._load(_signature(self.path))

    def _load(self, signature: _Signature) -> bool:
        # Remember the signature either way: a broken file is reported once, not every interval.
        self._seen = signature
        try:
            rules = self._loader(self.path)
        except (ConfigurationError, OSError) as exc:
            self.failures += 1
            error = str(exc)
            log.error("rules file %s refused, the previous rules stay in force:\n%s", self.path, error)
            self._notify(False, error)
            return False
        self._current = rules  # the swap: one assignment
        self.reloads += 1
        log.info("rules file %s reloaded", self.path)
        self._notify(True, None)
        return True

    def _notify(self, ok: bool, error: str | None) -> None:
        if self._on_reload is not None:
            try:
                self._on_reload(ok, error)
            except Exception:  # a failing hook must not take the rules down with it
                log.exception("on_reload hook failed")
