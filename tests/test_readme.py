"""The README's Python examples run as written (with a stand-in for the billing system)."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


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
