"""Write the blocking modules from their asyncio sources (``PAIRS``).

The blocking ``Limiter`` is the asyncio ``AsyncLimiter`` without ``async``/``await``, and
the Redis store's calls (``redis_calls.py``) are those of ``redis_calls_async.py``: one
source each, so the twins can never drift (the approach of psycopg's
``tools/async_to_sync.py`` and httpcore's ``scripts/unasync.py``). ``--check`` exits 1
when a target is not what this script would write; ``tests/test_unasync.py`` runs it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "ratekeeper"

# (asyncio source, blocking target, the target's docstring's first line)
PAIRS: list[tuple[Path, Path, str]] = [
    (
        PACKAGE / "limiter" / "async_limiter.py",
        PACKAGE / "limiter" / "limiter.py",
        "``Limiter``: decide, for a rule, a key and a cost, whether a request may proceed.",
    ),
    (
        PACKAGE / "stores" / "redis" / "calls_async.py",
        PACKAGE / "stores" / "redis" / "calls.py",
        "What the blocking Redis store sends and how: script calls, pipelines, NOSCRIPT, errors.",
    ),
    (
        PACKAGE / "stores" / "postgres" / "calls_async.py",
        PACKAGE / "stores" / "postgres" / "calls.py",
        "What the blocking PostgreSQL store runs and how: connections, statements, the schema, errors.",
    ),
]


def header(source: Path, title: str) -> str:
    return f'''"""{title}

Generated from ``{source.name}`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
"""
'''

# (pattern, replacement), applied in order to everything after the module docstring.
RULES: list[tuple[str, str]] = [
    (r"\basync def ", "def "),
    (r"\bawait ", ""),
    (r"\bAsyncLimiter\b", "Limiter"),
    (r"\bAsyncRedisCalls\b", "RedisCalls"),
    (r"\bAsyncPostgresCalls\b", "PostgresCalls"),
    (r"\basync with ", "with "),
    (r"\basync_client\b", "sync_client"),
    (r"\bAsyncLease\b", "Lease"),
    (r"\bAsyncObservedStore\b", "ObservedStore"),
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


def generate(source: str, path: Path, target: Path, title: str) -> str:
    """The sync module, formatted as the project formats code (``ruff format``)."""
    body = source[source.index('"""', 3) + 3 :].lstrip("\n")
    for pattern, replacement in RULES:
        body = re.sub(pattern, replacement, body)
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(target), "-"],
        input=header(path, title) + "\n" + body,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return formatted.stdout


def main(argv: list[str]) -> int:
    stale = 0
    for source, target, title in PAIRS:
        expected = generate(source.read_text(), source, target, title)
        if "--check" not in argv:
            target.write_text(expected)
        elif not target.exists() or target.read_text() != expected:
            print(f"{target.relative_to(ROOT)} is out of date: run python tools/unasync.py", file=sys.stderr)
            stale = 1
    return stale


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
