"""Every generated twin is current (``limiter.py`` from ``limiter_async.py``, ...): the APIs cannot drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_limiter_is_the_generated_sync_twin_of_async_limiter() -> None:
    """``python tools/unasync.py --check`` passes: edit the ``*_async.py`` source, then regenerate."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "unasync.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert 0 == result.returncode, result.stderr


def test_both_limiters_offer_the_same_methods() -> None:
    """Every public method of one exists on the other (aclose/close, the context protocols aside)."""
    from ratekeeper import AsyncLimiter, Limiter

    def public(cls: type) -> set[str]:
        return {name for name in vars(cls) if not name.startswith("_")}

    assert public(AsyncLimiter) - {"aclose"} == public(Limiter) - {"close"}
