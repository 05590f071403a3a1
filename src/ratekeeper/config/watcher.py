"""``RulesWatcher``: the rules of a file, reloaded when the file changes.

Readers call ``current`` on every request; it costs an attribute read, plus one
``os.stat`` at most once per ``interval`` of the injected clock. A changed file (its
``mtime_ns``, size, or inode: a file replaced by a rename, as editors and Kubernetes
ConfigMaps do) is loaded on a worker thread, never on the reader's (an event loop must
not stall while a file is parsed), and only once it has stood still for ``settle``
seconds (``ratekeeper.config.settled``), so a file being rewritten in place is not read
half-written. The new rules are swapped in by one attribute assignment, so a reader sees
the old rules or the new ones, never a mix, and until then the old ones. A file that
fails to load is refused: the old rules stay, every problem is logged to the
``ratekeeper`` logger, and the same broken file is not retried until it changes again.
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
from ratekeeper.config.settled import SETTLE, Signature, Unsettled, load_settled, signature

__all__ = ["FORCED_ROUNDS", "RulesWatcher"]

log = logging.getLogger("ratekeeper")

T = TypeVar("T")

FORCED_ROUNDS = 10
"""How many ``settle`` waits ``reload()`` gives a file that is still being written."""


class RulesWatcher(Generic[T]):
    """Loads ``path`` with ``loader`` now (raising on a bad file) and again when it changes.

    ``on_reload(ok, error)`` is called after every reload attempt (a metrics hook; from the
    worker thread): ``ok`` True with None, or False with the error text (every problem).
    ``reload()`` loads now on the calling thread (for SIGHUP and tests) and returns whether
    the new rules were taken; ``wait_idle()`` waits for a reload in flight to end.
    """

    @overload
    def __init__(
        self: RulesWatcher[RuleSet | EnvoyConfig],
        path: str | os.PathLike[str],
        *,
        interval: float = ...,
        settle: float = ...,
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
        settle: float = ...,
        clock: Callable[[], float] = ...,
        on_reload: Callable[[bool, str | None], None] | None = ...,
    ) -> None: ...

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        loader: Callable[[str], Any] = load_any,
        interval: float = 1.0,
        settle: float = SETTLE,
        clock: Callable[[], float] = time.monotonic,
        on_reload: Callable[[bool, str | None], None] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self._loader = loader
        self._interval = interval
        self._settle = settle
        self._clock = clock
        self._on_reload = on_reload
        self._check_lock = threading.Lock()  # one reader looks at the file at a time
        self._load_lock = threading.Lock()  # one load at a time (a worker's or reload()'s)
        self._idle = threading.Event()
        self._idle.set()
        self._seen: Signature | None = signature(self.path)
        self._current: T = loader(self.path)
        self._next_check = clock() + interval
        self.reloads = 0
        self.failures = 0

    @property
    def current(self) -> T:
        """The rules in force; looks at the file first when ``interval`` has passed."""
        if self._clock() >= self._next_check and self._check_lock.acquire(blocking=False):
            # One reader looks; the others go on with the rules they have.
            try:
                self._next_check = self._clock() + self._interval
                if self._idle.is_set() and signature(self.path) != self._seen:
                    self._idle.clear()
                    threading.Thread(
                        target=self._reload_in_background, name="ratekeeper-rules-reload", daemon=True
                    ).start()
            finally:
                self._check_lock.release()
        return self._current

    def reload(self) -> bool:
        """Load the file now, changed or not (waiting for it to settle); True when the new
        rules were taken."""
        with self._load_lock:
            return self._load(FORCED_ROUNDS) is True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no reload started by ``current`` is in flight; False after ``timeout``."""
        return self._idle.wait(timeout)

    def _reload_in_background(self) -> None:
        try:
            with self._load_lock:
                self._load(1)
        except Exception:  # a loader's bug must not end the watching: the old rules stay
            log.exception("rules file %s: the reload failed unexpectedly, the previous rules stay", self.path)
        finally:
            self._idle.set()

    def _load(self, rounds: int) -> bool | None:
        """True when new rules were taken, False when refused, None when the file was still
        changing (looked at again at the next check)."""
        try:
            loaded = load_settled(self.path, self._loader, self._settle, rounds)
        except Unsettled as exc:
            if rounds == 1:
                return None
            return self._refuse(signature(self.path), str(exc))
        if loaded.error is not None:
            return self._refuse(loaded.signature, loaded.error)
        self._seen = loaded.signature
        self._current = loaded.rules  # type: ignore[assignment]  # the swap: one assignment
        self.reloads += 1
        log.info("rules file %s reloaded", self.path)
        self._notify(True, None)
        return True

    def _refuse(self, seen: Signature | None, error: str) -> bool:
        # Remember what was refused: a broken file is reported once, not every interval.
        self._seen = seen
        self.failures += 1
        log.error("rules file %s refused, the previous rules stay in force:\n%s", self.path, error)
        self._notify(False, error)
        return False

    def _notify(self, ok: bool, error: str | None) -> None:
        if self._on_reload is not None:
            try:
                self._on_reload(ok, error)
            except Exception:  # a failing hook must not take the rules down with it
                log.exception("on_reload hook failed")
