"""The README's Python examples run as written (with a stand-in for the billing system)."""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextlib
import inspect
import io
import re
import symtable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ratekeeper import Limiter
from ratekeeper.limiter.breaker import CircuitBreaker
from ratekeeper.stores.postgres.options import PostgresOptions
from ratekeeper.stores.redis.planner import RedisPlanner

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.DOTALL)


SHOWN = re.compile(r"#\s*(->|prints:)\s*(.*?)\s*$")
"""A comment that shows an output: ``# -> <Python literal>`` after an expression (its
value), ``# prints: <text>`` on a line of a statement (what that statement prints)."""


def run_checking_shown_outputs(source: str, name: str, namespace: dict[str, Any]) -> int:
    """Run ``source`` one top-level statement at a time; every output a comment shows must
    be what the statement gives. Returns how many shown outputs were checked."""
    lines = source.splitlines()
    checked = 0
    for node in ast.parse(source).body:
        shown = [m for line in lines[node.lineno - 1 : node.end_lineno] if (m := SHOWN.search(line))]
        code = compile(ast.Module(body=[node], type_ignores=[]), name, "exec")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            if isinstance(node, ast.Expr):
                value = eval(compile(ast.Expression(node.value), name, "eval"), namespace)
            else:
                exec(code, namespace)
        for match in shown:
            kind, text = match.groups()
            where = f"{name} line {node.lineno}: {ast.get_source_segment(source, node)!r}"
            if kind == "->":
                assert isinstance(node, ast.Expr), f"{where}: '# ->' shows the value of an expression"
                assert ast.literal_eval(text) == value, f"{where} gives {value!r}, the README shows {text}"
            else:
                assert text + "\n" == printed.getvalue(), f"{where} prints {printed.getvalue()!r}, not {text!r}"
            checked += 1
    return checked


def test_the_tour_shows_what_it_gives() -> None:
    """Every output the tour's comments show is what its code gives, run as written."""
    namespace: dict[str, Any] = {}
    assert 3 <= run_checking_shown_outputs(python_blocks()[0], "README tour", namespace)


def test_the_tour_runs_and_decides_as_it_says() -> None:
    """The tour's calls work, and its login rule refuses the 6th call by the 5/3s limit."""
    namespace: dict[str, Any] = {}
    exec(compile(python_blocks()[0], "README tour", "exec"), namespace)
    asyncio.run(namespace["main"]())
    limiter, login = namespace["limiter"], namespace["login"]
    limiter.reset(login, "user-42")
    decisions = [limiter.try_acquire(login, "user-42") for _ in range(6)]
    assert [True] * 5 + [False] == [d.allowed for d in decisions]
    assert "5/3s" == str(decisions[-1].denied_by)
    assert [15, 0] == [s.remaining for s in decisions[-1].limits]


def test_the_quota_example_runs() -> None:
    """The quota example with a billing stand-in: the failsafe first, then the plan's limits."""
    plans = {"acme": SimpleNamespace(is_admin=False, per_minute=3)}
    namespace: dict[str, Any] = {
        "billing": SimpleNamespace(plan_of=plans.__getitem__),
        "customer_id": "acme",
    }
    tour = python_blocks()[0].split("async def main")[0]
    exec(compile(tour + python_blocks()[1], "README quotas", "exec"), namespace)
    api, quota = namespace["api"], namespace["api"].quota
    assert quota.wait_idle(5.0)
    assert "3/minute" == str(namespace["limiter"].try_acquire(api, "acme").limit)
    quota.close()


APPLICATION_NAMES = {"app", "billing", "customer_id"}
"""What the snippets take from the reader's own application (the web app, the billing
system, a request's customer id); every other name they use they import or define."""


def names_used_not_bound(source: str) -> set[str]:
    """The names ``source`` reads at module level or as globals inside its functions that
    it neither imports nor assigns, and that are not builtins."""
    top = symtable.symtable(source, "README", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    free: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        for symbol in table.get_symbols():
            if symbol.is_referenced() and (table is top or symbol.is_global()):
                free.add(symbol.get_name())
        tables.extend(table.get_children())
    return free - bound - set(dir(builtins))


def test_every_snippet_imports_the_names_it_uses() -> None:
    """Each Python block stands alone: copied into a file it needs only the reader's app."""
    blocks = python_blocks()
    assert len(blocks) >= 7
    for block in blocks:
        assert names_used_not_bound(block) <= APPLICATION_NAMES, block.splitlines()[0]


def call_keywords(call: ast.Call) -> dict[str, Any]:
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords if isinstance(k.value, ast.Constant)}


def test_the_defaults_the_readme_states_are_the_real_ones() -> None:
    """``Limiter(..., timeout=..., on_error=..., breaker=CircuitBreaker(...))  # the defaults``
    and "Redis 0.5 and PostgreSQL 1.0 by default" are what a limiter gets when given nothing."""
    block = next(b for b in python_blocks() if "# the defaults" in b)
    calls = [n for n in ast.walk(ast.parse(block)) if isinstance(n, ast.Call)]
    limiter_call = next(c for c in calls if ast.unparse(c.func) == "Limiter")
    breaker_call = next(c for c in calls if ast.unparse(c.func) == "CircuitBreaker")
    stated = call_keywords(limiter_call)
    url = ast.literal_eval(limiter_call.args[0])
    assert url.startswith("redis://")
    assert RedisPlanner(url).timeout == stated["timeout"]
    assert inspect.signature(Limiter).parameters["on_error"].default == stated["on_error"]
    breaker_defaults = inspect.signature(CircuitBreaker).parameters
    for name, value in call_keywords(breaker_call).items():
        assert breaker_defaults[name].default == value, name
    sentence = re.search(r"Redis ([\d.]+) and PostgreSQL ([\d.]+) by default", README)
    assert sentence is not None
    assert float(sentence.group(1)) == RedisPlanner("redis://localhost:6379/0").timeout
    assert float(sentence.group(2)) == PostgresOptions("postgresql://app@db/app").timeout
