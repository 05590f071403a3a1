"""One application instance of the ramping-load partner scenario (run in its own process).

It opens its own ``Limiter`` (its own connection pool), waits for the common start time,
then sends requests for one user on a schedule that ramps through ``phases`` (seconds,
requests per second of this instance), spread over ``threads`` threads, and reports what
it saw: admissions, refusals and errors.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ratekeeper import Limiter, Rule


def run(url: str, limit: str, start: float, phases: list[tuple[float, float]], threads: int, out: Any) -> None:
    rule = Rule("partner-ramp", [limit])
    schedule: list[float] = []
    t = start
    for duration, rate in phases:
        end = t + duration
        while t < end:
            schedule.append(t)
            t += 1.0 / rate
    stop = t
    counts = {"admitted": 0, "denied": 0, "errors": 0, "late": 0}
    errors: list[str] = []
    lock = threading.Lock()
    with Limiter(url, max_size=threads) as limiter:
        limiter.store.migrate()  # type: ignore[attr-defined]

        def worker(mine: list[float]) -> None:
            for at in mine:
                delay = at - time.time()
                if delay > 0:
                    time.sleep(delay)
                if time.time() >= stop:
                    with lock:
                        counts["late"] += 1
                    continue
                try:
                    d = limiter.try_acquire(rule, "user-1")
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    with lock:
                        counts["errors"] += 1
                        errors.append(repr(exc))
                    continue
                with lock:
                    counts["admitted" if d.allowed else "denied"] += 1

        pool = [threading.Thread(target=worker, args=(schedule[i::threads],)) for i in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    out.put({**counts, "error_samples": errors[:5]})
