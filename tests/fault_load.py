"""Load through a failing store (tests' helper): timed calls, and threads that keep deciding
while a test stops, pauses or restarts the server under them.

The fault tests of every server store (tests/redis_store, tests/postgres_store) drive their
limiters through these, each with its own timeout, margin and recovery bound. A test
disrupts the server when the threads have made the decisions it needs (``Progress``),
never after a fixed sleep.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ratekeeper import Decision, Rule

__all__ = ["Progress", "load", "threads_through", "timed", "wait_for_store"]


def timed(limiter: Any, rule: Rule, key: str, cost: int = 1) -> tuple[Decision, float]:
    """One ``try_acquire`` and the seconds it took."""
    start = time.monotonic()
    decision = limiter.try_acquire(rule, key, cost)
    return decision, time.monotonic() - start


def load(limiter: Any, rule: Rule, calls: int) -> tuple[list[Decision], float]:
    """``calls`` decisions over a few keys; the decisions and the slowest call's seconds."""
    results = [timed(limiter, rule, f"user-{i % 7}") for i in range(calls)]
    return [d for d, _ in results], max(s for _, s in results)


def wait_for_store(limiter: Any, rule: Rule, *, recovery: float, bound: float | None = None) -> Decision:
    """Ask until the store itself decides again (the breaker's probe succeeded), for at most
    ``recovery`` seconds; with ``bound``, every call on the way must end within it."""
    deadline = time.monotonic() + recovery
    while time.monotonic() < deadline:
        decision, took = timed(limiter, rule, "recovery")
        if bound is not None:
            assert took <= bound, f"a call took {took:.3f}s while the server came back"
        if decision.fallback is None:
            return decision
        time.sleep(0.05)
    raise AssertionError(f"the store was not used again within {recovery}s; breaker {limiter.breaker}")


class Progress:
    """The decisions the threads of ``threads_through`` have made, by ``Decision.fallback``
    (None: the store decided); ``wait_for`` blocks until more of a kind are made."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.counts: Counter[str | None] = Counter()

    def saw(self, fallback: str | None) -> None:
        with self.changed:
            self.counts[fallback] += 1
            self.changed.notify_all()

    def wait_for(self, fallback: str | None, decisions: int, timeout: float) -> None:
        """Block until ``decisions`` more decisions with ``fallback`` are made from now on."""
        with self.changed:
            target = self.counts[fallback] + decisions
            made = self.changed.wait_for(lambda: self.counts[fallback] >= target, timeout)
            assert made, f"{decisions} decisions with fallback {fallback!r} not made in {timeout}s: {self.counts}"


def threads_through(
    limiter: Any, rule: Rule, disrupt: Callable[[Progress], None], *, join: float, threads: int = 4
) -> tuple[list[BaseException], list[float], set[str | None]]:
    """``threads`` threads decide back to back (each on a key of its own) while
    ``disrupt(progress)`` runs; then they stop. Returns what they raised, each one's slowest
    call in seconds, and every ``Decision.fallback`` they saw (None: the store decided)."""
    stop = threading.Event()
    progress = Progress()
    slowest: list[float] = []
    errors: list[BaseException] = []
    seen: set[str | None] = set()

    def worker(n: int) -> None:
        worst, kinds = 0.0, set()
        try:
            while not stop.is_set():
                decision, took = timed(limiter, rule, f"t{n}")
                worst = max(worst, took)
                kinds.add(decision.fallback)
                progress.saw(decision.fallback)
                stop.wait(0.002)  # paced, so the threads leave the machine to the server
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)
        slowest.append(worst)
        seen.update(kinds)

    running = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in running:
        t.start()
    try:
        disrupt(progress)
    finally:
        stop.set()
        for t in running:
            t.join(join)
    return errors, slowest, seen
