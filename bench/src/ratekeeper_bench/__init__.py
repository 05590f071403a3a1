"""Benchmarks of ratekeeper against its peers (``ratekeeper bench ...``).

``ratekeeper_bench.memory`` compares the memory store with the in-memory stores of
``limits``, ``pyrate-limiter`` and ``throttled-py``; the peers are needed only to run it
and are imported when it runs.
"""

from __future__ import annotations

__all__: list[str] = []
