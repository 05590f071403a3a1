"""The Lua of the Redis store, composed from the files in ``lua/``, in two forms.

The files: ``prelude.lua`` (shared helpers), one file per algorithm (after the files it
names in a ``-- requires: a, b`` line), then ``main.lua``, which defines the dispatcher
``rk_dispatch(KEYS, ARGV)`` that reads the wire format of ``wire.py``. Each file documents
its spec fields and state at its top. The same text serves both forms:

- ``LIBRARY``, a Redis Functions library (Redis 7+): every file, then one
  ``redis.register_function``. ``FUNCTION LOAD`` runs the definitions once; each decision is
  one ``FCALL`` of the dispatcher. Library and function are named after a digest of the
  text (``ratekeeper_<sha12>``), so two ratekeeper versions sharing one Redis never clash.
- ``Script`` (``script_for`` / ``script_of``), for servers without Functions (Redis 6.2, or
  an ACL that forbids them): the prelude, the algorithms a call uses, ``main.lua`` and
  ``return rk_dispatch(KEYS, ARGV)``, called by ``EVALSHA``. Redis runs the whole chunk on
  every call, so a script defines only the algorithms it runs.

Redis forbids globals, so a file adds locals to the one chunk, visible to the files after
it. And Redis 7.0 loads a library in an environment without the standard globals
(``math``, ``string``, ``tonumber``, ``struct``, ``cmsgpack``...): a file's top level only
defines functions and constant tables; anything global is reached from inside a function
body, when a call runs it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from functools import cache
from importlib import resources

from ratekeeper.algorithms import ALGORITHMS

__all__ = ["ALGORITHM_FILES", "LIBRARY", "Library", "Script", "script_for", "script_of"]

ALGORITHM_FILES = tuple(ALGORITHMS)
"""One Lua file per algorithm of the registry, named after it, in its order."""


class Script:
    """A composed script for ``EVALSHA``: its text and the SHA1 that names it."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


class Library:
    """The Functions library: its name, the one function it registers, and its text
    (``FUNCTION LOAD REPLACE`` takes it as it is)."""

    __slots__ = ("function", "name", "source")

    def __init__(self, body: str) -> None:
        digest = hashlib.sha1(body.encode()).hexdigest()[:12]
        self.name = self.function = f"ratekeeper_{digest}"
        self.source = (
            f"#!lua name={self.name}\n{body}\n"
            f"redis.register_function{{function_name = '{self.function}', callback = rk_dispatch}}\n"
        )


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


def _body(names: Iterable[str]) -> str:
    """The prelude, the files of these algorithms (and what they require), ``main.lua``."""
    wanted = set(names)
    order: list[str] = []
    for name in ALGORITHM_FILES:  # a fixed order: the same set always gives the same text
        if name in wanted:
            order += [d for d in (*_requires(name), name) if d not in order]
    return "\n".join([_read("prelude"), *(_read(n) for n in order), _read("main")])


@cache
def _compose(names: frozenset[str]) -> Script:
    return Script(_body(names) + "\nreturn rk_dispatch(KEYS, ARGV)\n")


LIBRARY = Library(_body(ALGORITHM_FILES))
"""Every algorithm in one library, loaded once per server (``FUNCTION LOAD REPLACE``)."""

_single: dict[str, Script] = {}


def script_for(algorithms: Iterable[str]) -> Script:
    """The ``EVALSHA`` script that runs ops of these algorithms (each by its name)."""
    return _compose(frozenset(algorithms))


def script_of(algorithm: str) -> Script:
    """``script_for([algorithm])``, from a plain dict: the path of every single decision."""
    found = _single.get(algorithm)
    if found is None:
        found = _single[algorithm] = script_for((algorithm,))
    return found
