"""``CircuitBreaker``: stop calling a store that keeps failing, and try it again later.

A sans-IO state machine: it never calls the store and never sleeps; the limiters ask it
before a store call (``allow``) and tell it how the call went (``record_success`` /
``record_failure``). Time comes from an injectable ``Clock``.

::

    closed ──(``failures`` consecutive failures, or ``failure_rate`` of the calls
     ▲         in a ``window``)──▶ open ──(``cool_down`` passed)──▶ half_open
     │                              ▲                                  │
     └──────── the probe succeeds ──┼──────────────────────────────────┘
                                    └──────── the probe fails ─────────┘

While open, ``allow`` answers False at once (no call reaches the store). Half-open lets
ONE call through (the probe); every other call is refused until the probe's outcome is
known, or until ``cool_down`` has passed since the probe began (a probe whose caller was
cancelled never reports, and must not keep the breaker shut forever).

Cheap when the store is healthy: a success with no failure pending is one attribute
read. The breaker also tells a ``guard`` hook whether successes need reporting at all
(they do only after a failure), so a limiter can call the store directly, with no
bookkeeping, until something fails.

Thread-safe (one lock, held for a few attribute updates, never across I/O) and usable
from asyncio (nothing blocks). Transition listeners run outside the lock.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from ratekeeper.errors import CircuitOpen, ConfigurationError

if TYPE_CHECKING:
    from ratekeeper.clock import Clock

__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "CircuitBreaker"]

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

Listener = Callable[[str, str, "CircuitBreaker"], None]
"""Called as ``listener(old_state, new_state, breaker)`` after each transition."""


def _seconds(name: str, value: object, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or math.isinf(value):
        raise ConfigurationError(f"circuit breaker {name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ConfigurationError(f"circuit breaker {name} must be > 0 seconds, got {value!r}")
    return float(value)


class CircuitBreaker:
    """Opens after repeated store failures; after ``cool_down`` lets one probe call through.

    - ``failures``: open after this many consecutive failures (None: never by count).
    - ``failure_rate``: also open when, within a ``window`` of seconds starting at a
      failure, at least ``min_calls`` calls completed and this share of them failed
      (None, the default: by count only). For stores that fail intermittently.
    - ``cool_down``: seconds the breaker stays open before a probe; also the longest a
      probe may stay unanswered before another is let through.
    - ``clock``: where "now" comes from (``ratekeeper.testing.FakeClock`` in tests); the
      limiter gives its own clock to a breaker built without one.

    ``CircuitBreaker(failures=None)`` never opens (every call goes to the store).
    """

    __slots__ = (
        "_calls",
        "_consecutive",
        "_failed",
        "_guard",
        "_guarded",
        "_listeners",
        "_lock",
        "_opened_at",
        "_probe_at",
        "_state",
        "_window_start",
        "clock",
        "cool_down",
        "failure_rate",
        "failures",
        "last_error",
        "min_calls",
        "transitions",
        "window",
    )

    def __init__(
        self,
        failures: int | None = 5,
        *,
        failure_rate: float | None = None,
        min_calls: int = 20,
        window: float = 10.0,
        cool_down: float = 1.0,
        clock: Clock | None = None,
    ) -> None:
        if failures is not None and (type(failures) is not int or failures < 1):
            raise ConfigurationError(
                f"circuit breaker failures must be a positive integer (or None: never open by count), got {failures!r}"
            )
        if failure_rate is not None and (
            isinstance(failure_rate, bool) or not isinstance(failure_rate, int | float) or not 0 < failure_rate <= 1
        ):
            raise ConfigurationError(
                f"circuit breaker failure_rate must be a share in (0, 1] (or None: by count only), got {failure_rate!r}"
            )
        if type(min_calls) is not int or min_calls < 1:
            raise ConfigurationError(f"circuit breaker min_calls must be a positive integer, got {min_calls!r}")
        self.failures = failures
        self.failure_rate = None if failure_rate is None else float(failure_rate)
        self.min_calls = min_calls
        self.window = _seconds("window", window)
        self.cool_down = _seconds("cool_down", cool_down)
        self.clock: Clock | None = clock
        self.transitions: Counter[tuple[str, str]] = Counter()
        """How many times each ``(old_state, new_state)`` transition happened."""
        self.last_error: BaseException | None = None
        """The last failure recorded (for logs and health endpoints)."""
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._guard: Callable[[bool], None] | None = None
        self._state = CLOSED
        self._guarded = False  # closed with no failure pending: successes need no report
        self._consecutive = 0
        self._calls = 0
        self._failed = 0
        self._window_start = 0
        self._opened_at = 0
        self._probe_at: int | None = None

    # -- what the limiters call -------------------------------------------------------

    @property
    def state(self) -> str:
        """``"closed"``, ``"open"`` or ``"half_open"`` (an open breaker past its cool-down
        still reads ``"open"`` until a call asks to go through)."""
        return self._state

    @property
    def guarded(self) -> bool:
        """Whether calls must ask ``allow`` and report successes (False: closed, all well)."""
        return self._guarded

    def allow(self) -> bool:
        """Whether a call may go to the store now. Open: False until ``cool_down`` has
        passed, then True for exactly one caller (the probe, now half-open)."""
        state = self._state
        if state is CLOSED:
            return True
        now = self._now()
        cool = round(self.cool_down * 1_000_000)
        if state is OPEN and now - self._opened_at < cool:
            return False  # the common case while open: no lock taken
        changed = None
        with self._lock:
            state = self._state
            if state is CLOSED:
                return True
            if state is OPEN:
                if now - self._opened_at < cool:
                    return False
                changed = self._set(HALF_OPEN)
                self._probe_at = now
            elif self._probe_at is not None and now - self._probe_at < cool:
                return False
            else:
                self._probe_at = now  # the last probe never reported: let another through
        self._notify(changed)
        return True

    def check(self) -> None:
        """``allow``, raising ``CircuitOpen`` (a ``StoreError``) when the call must not be made."""
        if self._state is not CLOSED and not self.allow():
            raise self.open_error()

    def __enter__(self) -> None:
        """``with breaker:`` around one store call: ``check`` before it, ``record_success``
        when it answered (a ``StoreError`` is recorded by the failure policy that handles it)."""
        self.check()

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.record_success()

    def open_error(self) -> CircuitOpen:
        """The error for a call the breaker refused: says for how long, and the last failure."""
        return CircuitOpen(
            f"the store is not called: its circuit breaker is {self._state} after repeated failures "
            f"(next try in {self.remaining():.3f}s; last error: {self.last_error})"
        )

    def record_success(self) -> None:
        """The store answered. Half-open: close. Closed: the failure streak ends."""
        if not self._guarded:
            return
        changed = None
        with self._lock:
            state = self._state
            if state is HALF_OPEN:
                changed = self._set(CLOSED)
                self._reset_counts(self._now())
                self._set_guarded(False)
            elif state is CLOSED:
                self._consecutive = 0
                if self.failure_rate is None:
                    self._set_guarded(False)
                else:
                    self._roll(self._now())
                    self._calls += 1
                    if self._failed == 0:
                        self._set_guarded(False)
            # open: a call that began before the breaker opened; the probe decides.
        self._notify(changed)

    def record_failure(self, error: BaseException | None = None) -> None:
        """The store failed (or did not answer in time). May open the breaker."""
        changed = None
        with self._lock:
            self.last_error = error
            now = self._now()
            state = self._state
            if state is HALF_OPEN:
                changed = self._open(now)
            elif state is CLOSED:
                if not self._guarded:
                    self._reset_counts(now)
                    self._set_guarded(True)
                self._roll(now)
                self._consecutive += 1
                self._calls += 1
                self._failed += 1
                rate = self.failure_rate
                if (self.failures is not None and self._consecutive >= self.failures) or (
                    rate is not None and self._calls >= self.min_calls and self._failed >= rate * self._calls
                ):
                    changed = self._open(now)
            # open: a call that began before the breaker opened; nothing new.
        self._notify(changed)

    def remaining(self) -> float:
        """Seconds until the breaker lets a probe through (0 when it is not open)."""
        if self._state is not OPEN:
            return 0.0
        left = self._opened_at + round(self.cool_down * 1_000_000) - self._now()
        return max(0, left) / 1_000_000

    # -- hooks --------------------------------------------------------------------------

    def on_transition(self, listener: Listener) -> None:
        """Call ``listener(old, new, breaker)`` after every state change (outside the lock)."""
        self._listeners.append(listener)

    def set_guard(self, guard: Callable[[bool], None]) -> None:
        """Call ``guard(guarded)`` now and whenever ``guarded`` flips, under the lock, so the
        calls arrive in the order of the flips. It must be quick and must not call the
        breaker. One guard per breaker: a breaker serves one limiter."""
        with self._lock:
            if self._guard is not None:
                raise ConfigurationError("this CircuitBreaker already serves a limiter; give each limiter its own")
            self._guard = guard
            guard(self._guarded)

    def reset(self) -> None:
        """Close the breaker and forget every failure (an operator's override)."""
        with self._lock:
            changed = None if self._state is CLOSED else self._set(CLOSED)
            self._reset_counts(self._now())
            self._set_guarded(False)
        self._notify(changed)

    def __repr__(self) -> str:
        return (
            f"<CircuitBreaker {self._state} failures={self.failures} failure_rate={self.failure_rate} "
            f"cool_down={self.cool_down}s>"
        )

    # -- internals (under the lock) -------------------------------------------------------

    def _now(self) -> int:
        clock = self.clock
        if clock is None:
            import time

            return time.monotonic_ns() // 1000
        return clock.now_us()

    def _set(self, state: str) -> tuple[str, str]:
        old, self._state = self._state, state
        self.transitions[old, state] += 1
        return old, state

    def _open(self, now: int) -> tuple[str, str]:
        self._opened_at = now
        self._probe_at = None
        self._set_guarded(True)
        return self._set(OPEN)

    def _set_guarded(self, guarded: bool) -> None:
        if guarded != self._guarded:
            self._guarded = guarded
            if self._guard is not None:
                self._guard(guarded)

    def _reset_counts(self, now: int) -> None:
        self._consecutive = self._calls = self._failed = 0
        self._window_start = now

    def _roll(self, now: int) -> None:
        """Start a new rate window when the current one is over (the streak continues)."""
        if now - self._window_start >= round(self.window * 1_000_000):
            self._calls = self._failed = 0
            self._window_start = now

    def _notify(self, changed: tuple[str, str] | None) -> None:
        if changed is not None:
            for listener in self._listeners:
                listener(changed[0], changed[1], self)
