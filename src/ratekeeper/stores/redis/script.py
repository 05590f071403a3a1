"""The Lua scripts of the Redis store, composed from the files in ``stores/lua/``.

Each algorithm has its script: ``prelude.lua`` (shared helpers), the algorithm's file
(after the files it names in a ``-- requires: a, b`` line), then ``main.lua`` (the
dispatcher that reads the wire format of ``wire.py``). A call whose ops use several
algorithms (``try_acquire_many`` across rules) runs the script of all of them. Each file
documents its spec fields and state at its top. Redis forbids globals in scripts, so a
file adds locals to the one chunk, visible to the files after it; and a script defines
only what it runs, because Redis executes the whole chunk (every definition) per call.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from functools import cache
from importlib import resources

from ratekeeper.algorithms import ALGORITHMS

__all__ = ["ALGORITHM_FILES", "Script", "script_for", "script_of"]

ALGORITHM_FILES = tuple(ALGORITHMS)
"""One script (SQL file) per algorithm of the registry, named after it, in its order."""


class Script:
    """A composed script: its text and the SHA1 that EVALSHA names it by."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


def _read(name: str) -> str:
    return (resources.files("ratekeeper.stores.redis") / "lua" / f"{name}.lua").read_text()


@cache
def _requires(name: str) -> tuple[str, ...]:
    """The files ``name`` builds on, from its ``-- requires:`` line, each before its user."""
    found = re.search(r"^-- requires:(.*)$", _read(name), re.MULTILINE)
    if not found:
        return ()
    order: list[str] = []
    for dep in (d.strip() for d in found.group(1).split(",")):
        if dep:
            order += [d for d in (*_requires(dep), dep) if d not in order]
    return tuple(order)


@cache
def _compose(names: frozenset[str]) -> Script:
    order: list[str] = []
    for name in ALGORITHM_FILES:  # a fixed order: the same set always gives the same SHA
        if name in names:
            order += [d for d in (*_requires(name), name) if d not in order]
    return Script("\n".join([_read("prelude"), *(_read(n) for n in order), _read("main")]))


_single: dict[str, Script] = {}


def script_for(algorithms: Iterable[str]) -> Script:
    """The script that runs ops of these algorithms (each by its name)."""
    return _compose(frozenset(algorithms))


def script_of(algorithm: str) -> Script:
    """``script_for([algorithm])``, from a plain dict: the path of every single decision."""
    found = _single.get(algorithm)
    if found is None:
        found = _single[algorithm] = script_for((algorithm,))
    return found
