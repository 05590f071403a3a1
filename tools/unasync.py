"""Write the blocking modules from their asyncio sources (``PAIRS``).

The blocking ``Limiter`` is the asyncio ``AsyncLimiter`` without ``async``/``await``, and
the stores' blocking calls are those of their ``calls_async.py``: one source each, so the
twins can never drift (the approach of psycopg's ``tools/async_to_sync.py`` and httpcore's
``scripts/unasync.py``).

The source is transformed token by token (``tokenize``), never by regular expressions
over text, so strings and comments are never rewritten by accident:

- ``async def`` / ``async with`` / ``async for`` lose ``async``; ``await`` disappears;
- names are renamed by ``NAMES`` (every pair) and the pair's own map;
- a name left twice in a row by the renaming (``AsyncStore, Store`` -> ``Store, Store``,
  ``AsyncStore | Store``) is written once.

The result goes through ruff (the version pinned by the ``test`` extra): its import
sorting, since a rename can unsort an import line, and ``ruff format`` to lay out the
lines the removals shortened. ``--check`` exits 1 when a target is not what
this script would write; ``tests/project/test_unasync.py`` runs it.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "ratekeeper"

NAMES: dict[str, str] = {
    "AsyncStore": "Store",
    "open_async_store": "open_store",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "aclose": "close",
    "AsyncObservedStore": "ObservedStore",
    "AsyncOverLimitCache": "OverLimitCache",
}
"""Renames that hold for every pair."""

_DRIVE = {"drive_async": "drive", "agather": "gather", "asleep": "sleep"}
"""The limiter's renames: its drivers' module and the primitives of ``limiter/acompat.py``."""

_REDIS = {
    "AsyncRedisStore": "RedisStore",
    "AsyncRedisShell": "RedisShell",
    "AsyncLane": "Lane",
    "AsyncLimiter": "Limiter",
    "shell_async": "shell",
    "lane_async": "lane",
    "driver_asyncio": "driver_threads",
    "async_client": "sync_client",
}
"""The Redis store's renames: its drivers (``driver_asyncio`` -> ``driver_threads``) and clients."""

_POSTGRES = {
    "AsyncPostgresStore": "PostgresStore",
    "AsyncPostgresShell": "PostgresShell",
    "shell_async": "shell",
    "driver_asyncio": "driver_threads",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncConnection": "Connection",
}
"""The PostgreSQL store's renames: its drivers (``driver_asyncio`` -> ``driver_threads``) and psycopg's classes."""

_SERVICE = {
    "AsyncServiceStore": "ServiceStore",
    "AsyncServiceShell": "ServiceShell",
    "shell_async": "shell",
    "driver_asyncio": "driver_threads",
    "AsyncClient": "Client",
}
"""The service store's renames: its drivers (``driver_asyncio`` -> ``driver_threads``) and httpx's client."""

# (asyncio source, blocking target, the target's docstring's first line, the pair's renames)
PAIRS: list[tuple[Path, Path, str, dict[str, str]]] = [
    (
        PACKAGE / "limiter" / "limiter_async.py",
        PACKAGE / "limiter" / "limiter.py",
        "``Limiter``: decide, for a rule, a key and a cost, whether a request may proceed; ``Lease``.",
        {"AsyncLimiter": "Limiter", "AsyncLease": "Lease", "store_wrappers_async": "store_wrappers", **_DRIVE},
    ),
    (
        PACKAGE / "limiter" / "drive_async.py",
        PACKAGE / "limiter" / "drive.py",
        "Run a request's transaction (``transaction``), or a flow around one, against a ``Limiter``.",
        {"AsyncLimiter": "Limiter", "limiter_async": "limiter", **_DRIVE},
    ),
    (
        PACKAGE / "web" / "core_async.py",
        PACKAGE / "web" / "core.py",
        "``RateLimitCore``: the web core of the blocking integrations (WSGI, Flask, sync Django).",
        {"AsyncRateLimitCore": "RateLimitCore", "AsyncLimiter": "Limiter", "limiter_async": "limiter", **_DRIVE},
    ),
    (
        PACKAGE / "stores" / "coalescing_driver_async.py",
        PACKAGE / "stores" / "coalescing_driver.py",
        "``Driver``: what the thread driver of ``Coalescer`` holds, and how it sends one call.",
        {"AsyncDriver": "Driver"},
    ),
    (
        PACKAGE / "limiter" / "store_wrappers_async.py",
        PACKAGE / "limiter" / "store_wrappers.py",
        "The stores a ``Limiter`` wraps around its own: ``ObservedStore`` and ``OverLimitCache``.",
        {},
    ),
    (
        PACKAGE / "stores" / "redis" / "lane_async.py",
        PACKAGE / "stores" / "redis" / "lane.py",
        "``Lane``: one connection of the blocking Redis store's pool, held for the decision calls.",
        _REDIS,
    ),
    (
        PACKAGE / "stores" / "redis" / "shell_async.py",
        PACKAGE / "stores" / "redis" / "shell.py",
        "``RedisShell``: sends what a ``RedisPlanner`` planned for the blocking Redis store.",
        _REDIS,
    ),
    (
        PACKAGE / "stores" / "redis" / "store_async.py",
        PACKAGE / "stores" / "redis" / "store.py",
        "``RedisStore``: the Redis / Valkey store for ``Limiter`` (a planner and a shell; see ``store_async.py``).",
        _REDIS,
    ),
    (
        PACKAGE / "stores" / "postgres" / "shell_async.py",
        PACKAGE / "stores" / "postgres" / "shell.py",
        "How the blocking PostgreSQL store sends what ``PostgresPlanner`` plans: the pool, the kept\n"
        "connection, prepared statements, the warm-up, the client-side deadline, the migration.",
        _POSTGRES,
    ),
    (
        PACKAGE / "stores" / "postgres" / "store_async.py",
        PACKAGE / "stores" / "postgres" / "store.py",
        "``PostgresStore``: the PostgreSQL store for ``Limiter`` (a planner and a shell; see ``store_async.py``).",
        _POSTGRES,
    ),
    (
        PACKAGE / "stores" / "service" / "shell_async.py",
        PACKAGE / "stores" / "service" / "shell.py",
        "How the blocking service store sends what ``ServicePlanner`` plans: one ``POST /v1/store`` per call.",
        _SERVICE,
    ),
    (
        PACKAGE / "stores" / "service" / "store_async.py",
        PACKAGE / "stores" / "service" / "store.py",
        "``ServiceStore``: the ratekeeper service as a store for ``Limiter`` (a planner and a shell).",
        _SERVICE,
    ),
]

_JOINERS = {",", "|"}


def header(source: Path, title: str) -> str:
    return f'''"""{title}

Generated from ``{source.name}`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
"""
'''


def _rename_words(text: str, names: dict[str, str]) -> str:
    """``text`` (a string or comment token) with each mapped name renamed as a whole word."""
    return re.sub(r"\b\w+\b", lambda m: names.get(m.group(0), m.group(0)), text)


def _edits(tokens: list[_Token], names: dict[str, str]) -> list[tuple[int, int, str]]:
    """(start, end, replacement) character spans of the source to rewrite."""
    edits: list[tuple[int, int, str]] = []
    kept: list[tuple[str, bool]] = []  # the significant tokens written so far, and whether renamed
    for i, tok in enumerate(tokens):
        start, end = tok.start_offset, tok.end_offset
        if tok.type in (tokenize.STRING, tokenize.COMMENT):
            renamed = _rename_words(tok.string, names)
            if renamed != tok.string:
                edits.append((start, end, renamed))
            continue
        if tok.type != tokenize.NAME:
            if tok.type == tokenize.OP:
                kept.append((tok.string, False))
            continue
        following = tokens[i + 1]
        if (tok.string == "async" and following.string in ("def", "with", "for")) or tok.string == "await":
            # Up to the next token: the keyword and the space after it.
            edits.append((start, following.start_offset, ""))
            continue
        new = names.get(tok.string, tok.string)
        # "X, X" or "X | X" left by a rename: keep the first.
        renamed = new != tok.string
        if len(kept) >= 2 and kept[-1][0] in _JOINERS and kept[-2][0] == new and (renamed or kept[-2][1]):
            edits.append((tokens[i - 1].start_offset, end, ""))
            continue
        if renamed:
            edits.append((start, end, new))
        kept.append((new, renamed))
    return edits


def generate(source: str, path: Path, target: Path, title: str, renames: dict[str, str]) -> str:
    """The blocking module, formatted as the project formats code."""
    lines = source.splitlines(keepends=True)
    line_starts = [0]
    for line in lines:
        line_starts.append(line_starts[-1] + len(line))

    def offset(row_col: tuple[int, int]) -> int:
        return line_starts[row_col[0] - 1] + row_col[1]

    tokens = [
        _Token(t.type, t.string, offset(t.start), offset(t.end))
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
    ]
    docstring = next(t for t in tokens if t.type == tokenize.STRING)
    body_tokens = [t for t in tokens if t.start_offset >= docstring.end_offset]
    code = source
    for start, end, text in sorted(_edits(body_tokens, {**NAMES, **renames}), reverse=True):
        code = code[:start] + text + code[end:]
    code = code[docstring.end_offset :]
    code = header(path, title) + "\n" + code.lstrip("\n")
    # Renames can unsort an import line: sort (ruff's isort rule), then lay out the lines.
    for ruff in (["check", "--select", "I", "--fix", "--exit-zero", "--quiet"], ["format"]):
        code = subprocess.run(
            [sys.executable, "-m", "ruff", *ruff, "--stdin-filename", str(target), "-"],
            input=code,
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout
    return code


class _Token(NamedTuple):
    type: int
    string: str
    start_offset: int
    end_offset: int


def main(argv: list[str]) -> int:
    stale = 0
    for source, target, title, renames in PAIRS:
        expected = generate(source.read_text(), source, target, title, renames)
        if "--check" not in argv:
            target.write_text(expected)
        elif not target.exists() or target.read_text() != expected:
            print(f"{target.relative_to(ROOT)} is out of date: run python tools/unasync.py", file=sys.stderr)
            stale = 1
    return stale


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
