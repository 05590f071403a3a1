"""Write ``src/ratekeeper/limiter.py`` from ``src/ratekeeper/async_limiter.py``.

The blocking ``Limiter`` is the asyncio ``AsyncLimiter`` without ``async``/``await``: one
source, so the two can never drift (the approach of psycopg's ``tools/async_to_sync.py``
and httpcore's ``scripts/unasync.py``). ``--check`` exits 1 when ``limiter.py`` is not
what this script would write; ``tests/test_unasync.py`` runs it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "ratekeeper" / "async_limiter.py"
TARGET = ROOT / "src" / "ratekeeper" / "limiter.py"

HEADER = '''"""``Limiter``: decide, for a rule, a key and a cost, whether a request may proceed.

Generated from ``async_limiter.py`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
"""
'''

# (pattern, replacement), applied in order to everything after the module docstring.
RULES: list[tuple[str, str]] = [
    (r"\basync def ", "def "),
    (r"\bawait ", ""),
    (r"\bAsyncLimiter\b", "Limiter"),
    (r"\bAsyncLease\b", "Lease"),
    (r"\bAsyncStore \| Store\b", "Store"),
    (r"\bAsyncStore\b", "Store"),
    (r"\bopen_async_store\b", "open_store"),
    (r"\brun_async\b", "run_sync"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\baclose\b", "close"),
    (r"is_async_limiter=True", "is_async_limiter=False"),
    (r"from ratekeeper\.stores\.base import Store, Store\n", "from ratekeeper.stores.base import Store\n"),
]


def generate(source: str) -> str:
    """The sync module, formatted as the project formats code (``ruff format``)."""
    body = source[source.index('"""', 3) + 3 :].lstrip("\n")
    for pattern, replacement in RULES:
        body = re.sub(pattern, replacement, body)
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(TARGET), "-"],
        input=HEADER + "\n" + body,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return formatted.stdout


def main(argv: list[str]) -> int:
    expected = generate(SOURCE.read_text())
    if "--check" in argv:
        if TARGET.read_text() != expected:
            print(f"{TARGET.relative_to(ROOT)} is out of date: run python tools/unasync.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(expected)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
