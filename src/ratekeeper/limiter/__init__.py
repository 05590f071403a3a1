"""The limiter shell: ``Limiter`` and ``AsyncLimiter`` over a store.

Every ``*_async.py`` here is a source whose blocking twin ``tools/unasync.py`` writes:
``limiter_async.py`` -> ``limiter.py``, ``store_wrappers_async.py`` -> ``store_wrappers.py``,
``drive_async.py`` -> ``drive.py`` (a request's transaction run against a limiter);
``acompat`` holds the few primitives whose two forms differ by more than ``await``. What
both share is sans-IO and written once: the argument checks (``checks``), the waiting
logic of ``acquire`` (``flows``), a request's transaction (``transaction``), the failure
policy and the circuit breaker (``failure``, ``breaker``), the observer seam
(``observer``), the over-limit cache's entries (``overlimit``), the decorator and the
state of a lease (``lease_state``).
"""

from __future__ import annotations

from ratekeeper.limiter.limiter import Lease, Limiter
from ratekeeper.limiter.limiter_async import AsyncLease, AsyncLimiter

__all__ = ["AsyncLease", "AsyncLimiter", "Lease", "Limiter"]
