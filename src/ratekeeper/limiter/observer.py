"""The observer seam: what a limiter tells about its work, for metrics and logs.

``Limiter(store, observer=obs)`` (or ``AsyncLimiter``) reports to ``obs``:

- ``decided(decision)``: every decision that charges or refuses, as the store (or, when
  the store failed, the failure policy: ``decision.fallback`` is set) gave it: those of
  ``try_acquire``, of each step of ``acquire`` and of each item of ``try_acquire_many``.
  Not peeks, and not keys that no limit applies to (they never reach a store).
- ``store_call(seconds, error)``: each call made to the store: how long it took, and the
  ``StoreError`` it raised (None when it answered). A call the open circuit breaker
  refused is not a store call and is not reported here; its fallback decision is.
- ``breaker_changed(old, new)``: a transition of the circuit breaker (``CLOSED``,
  ``OPEN``, ``HALF_OPEN``).

Nothing is paid without an observer: the limiter then calls its store directly. With one,
the store is wrapped in ``ObservedStore`` / ``AsyncObservedStore`` (``store_wrappers``),
which time each call; the methods run on the caller's thread (or event loop) right after
the call, so they must be quick and must not block; an exception they raise reaches the caller.
Per-key data must not be kept by an exporter (keys are unbounded); the decision's
``rule`` name is the label.
"""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING, Protocol

from ratekeeper.errors import StoreError

if TYPE_CHECKING:
    from ratekeeper.decision import Decision

__all__ = ["Observer", "TimedCall"]


class Observer(Protocol):
    """Receives a limiter's reports (see the module docstring). ``ratekeeper.testing``
    has ``RecordingObserver``, which keeps them all, for tests."""

    def decided(self, decision: Decision) -> None: ...

    def store_call(self, seconds: float, error: StoreError | None) -> None: ...

    def breaker_changed(self, old: str, new: str) -> None: ...


class TimedCall:
    """Times one store call and reports it (with its ``StoreError``, if it raised one)."""

    __slots__ = ("observer", "start")

    def __init__(self, observer: Observer) -> None:
        self.observer = observer

    def __enter__(self) -> None:
        self.start = perf_counter()

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, StoreError):
            self.observer.store_call(perf_counter() - self.start, exc)
