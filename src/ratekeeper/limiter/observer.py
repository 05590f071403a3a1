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

Optional, looked up once when the limiter is built (an observer without them is told
the rest, as before they existed):

- ``charged(decision, cost)``: each charge without a check (``Limiter.charge``), with the
  decision after it (``remaining`` below zero: the key is in debt), as the store or the
  failure policy gave it (under ``"deny"`` the charge was not applied: ``allowed`` is
  False). A charge is not a ``decided``: it refuses nothing.
- ``refunded(rule, cost)``: cost the store gave back to a key of ``rule`` (the rule's
  name): a ``refund``, or a reservation ``acquire`` returned. Not lease releases, nor
  refunds the store did not accept (nothing charged to give back) or that failed.
- ``wants_keys = True``: ``decided`` and ``charged`` are then called with the key too,
  as one more argument: ``decided(decision, key)``, ``charged(decision, cost, key)``, for
  an exporter that records keys where the operator asked for it (``OpenTelemetry(...,
  record_key=True)``). Without it no key is passed, and nothing is paid for it.

Nothing is paid without an observer: the limiter then calls its store directly. With one,
the store is wrapped in ``ObservedStore`` / ``AsyncObservedStore`` (``store_wrappers``),
which time each call; the methods run on the caller's thread (or event loop) right after
the call, so they must be quick and must not block; an exception they raise reaches the caller.
Per-key data must not be kept by an exporter (keys are unbounded); the decision's
``rule`` name is the label.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Protocol

from ratekeeper.errors import StoreError

if TYPE_CHECKING:
    from ratekeeper.decision import Decision

__all__ = ["Observer", "Reports", "TimedCall"]


class Observer(Protocol):
    """Receives a limiter's reports (see the module docstring). ``ratekeeper.testing``
    has ``RecordingObserver``, which keeps them all, for tests."""

    def decided(self, decision: Decision) -> None: ...

    def store_call(self, seconds: float, error: StoreError | None) -> None: ...

    def breaker_changed(self, old: str, new: str) -> None: ...


class Reports:
    """What a limiter tells ``observer`` beyond the three required reports, its optional
    methods looked up once (see the module docstring): ``charged`` and ``refunded`` (None
    when it has none), ``keys`` (``wants_keys``) and ``decided_key``, its ``decided`` when
    it takes the key (else None)."""

    __slots__ = ("charged", "decided_key", "keys", "observer", "refunded")

    def __init__(self, observer: Observer) -> None:
        self.observer = observer
        self.charged: Callable[..., None] | None = getattr(observer, "charged", None)
        self.refunded: Callable[[str, int], None] | None = getattr(observer, "refunded", None)
        self.keys: bool = getattr(observer, "wants_keys", False) is True
        self.decided_key: Callable[[Decision, str], None] | None = (
            observer.decided if self.keys else None  # type: ignore[assignment]  # wants_keys: it takes the key
        )

    def decided(self, decision: Decision, key: str) -> None:
        """Tell the observer one decision, with its key when it wants keys (the paths off
        the hot one: the failure policy, the over-limit cache)."""
        if self.decided_key is not None:
            self.decided_key(decision, key)
        else:
            self.observer.decided(decision)

    def charge(self, decision: Decision, cost: int, key: str) -> None:
        """Tell the observer one charge, when it takes charges (with the key when it wants keys)."""
        charged = self.charged
        if charged is not None:
            if self.keys:
                charged(decision, cost, key)
            else:
                charged(decision, cost)


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
