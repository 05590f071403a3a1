"""The limiter shell: ``Limiter`` and ``AsyncLimiter`` over a store.

``async_limiter.py`` is the source; ``limiter.py`` is generated from it
(``tools/unasync.py``). What both share is sans-IO and written once: the argument checks
(``checks``), the waiting logic of ``acquire`` (``flows``), the failure policy and the
circuit breaker (``failure``, ``breaker``), the observer seam (``observer``), the
decorator and the lease context managers.
"""

from __future__ import annotations

from ratekeeper.limiter.async_limiter import AsyncLimiter
from ratekeeper.limiter.limiter import Limiter

__all__ = ["AsyncLimiter", "Limiter"]
