"""The limiter shell: ``Limiter`` and ``AsyncLimiter`` over a store.

``limiter_async.py`` is the source; ``limiter.py`` is generated from it, as
``store_wrappers.py`` is from ``store_wrappers_async.py`` (``tools/unasync.py``). What
both share is sans-IO and written once: the argument checks (``checks``), the waiting
logic of ``acquire`` (``flows``), the failure policy and the circuit breaker
(``failure``, ``breaker``), the observer seam (``observer``), the over-limit cache's
entries (``overlimit``), the decorator and the state of a lease (``lease_state``).
"""

from __future__ import annotations

from ratekeeper.limiter.limiter import Lease, Limiter
from ratekeeper.limiter.limiter_async import AsyncLease, AsyncLimiter

__all__ = ["AsyncLease", "AsyncLimiter", "Lease", "Limiter"]
