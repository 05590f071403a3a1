"""The one Lua script of the Redis store, composed from the files in ``stores/lua/``.

``prelude.lua`` (shared helpers), then one file per algorithm, then ``main.lua`` (the
dispatcher that reads the wire format of ``wire.py``). Each algorithm file documents its
spec fields and state at its top. Redis forbids globals in scripts, so every file adds
locals to the one chunk: a file may use the helpers of the files before it (the leaky
bucket reuses GCRA's).
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

__all__ = ["ALGORITHM_FILES", "script", "script_sha"]

ALGORITHM_FILES = (
    "gcra",
    "token_bucket",
    "leaky_bucket",
    "fixed_window",
    "sliding_window_counter",
    "sliding_window_log",
    "concurrency",
)


@cache
def script() -> str:
    """The composed script's text (algorithm files not yet written are left out)."""
    folder = resources.files("ratekeeper.stores") / "lua"
    parts = [(folder / "prelude.lua").read_text()]
    for name in ALGORITHM_FILES:
        path = folder / f"{name}.lua"
        if path.is_file():
            parts.append(path.read_text())
    parts.append((folder / "main.lua").read_text())
    return "\n".join(parts)


@cache
def script_sha() -> str:
    """SHA1 of the script: what EVALSHA names it by."""
    return hashlib.sha1(script().encode()).hexdigest()
