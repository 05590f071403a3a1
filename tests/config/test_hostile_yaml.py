"""Hostile rules files: alias bombs, deep nesting, self-referencing anchors, huge numbers and
huge files are problems with their file and line, found quickly, never a hang, a memory
blow-up or a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import WriteFile
from ratekeeper.config import ConfigProblems, load_any, load_envoy, load_rules, parse_any
from ratekeeper.config.checks import MAX_LIMITS
from ratekeeper.config.yamlfile import MAX_DEPTH, MAX_FILE_BYTES, MAX_REPEATED

ROOT = Path(__file__).resolve().parents[2]

# Nine levels of nine aliases: 9**9 (387 million) strings once expanded, from 350 bytes.
BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
rules: *i
"""

# The same growth through merge keys: each level merges nine copies of the one before.
MERGE_BOMB = (
    "a: &a {a1: 1, a2: 1, a3: 1, a4: 1, a5: 1, a6: 1, a7: 1, a8: 1, a9: 1}\n"
    + "".join(f"{c}: &{c} {{<<: [{', '.join([f'*{p}'] * 9)}]}}\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    + "rules: [*i]\n"
)


def _problems(path: Path) -> list[str]:
    with pytest.raises(ConfigProblems) as info:
        load_any(path)
    return list(info.value.problems)


def test_config_check_refuses_a_billion_laughs_file_within_seconds(write: WriteFile) -> None:
    path = write(BILLION_LAUGHS, "bomb.yaml")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ratekeeper", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        check=False,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert f"{path}:6: YAML aliases here repeat more than {MAX_REPEATED:,} values" in done.stderr
    assert "Traceback" not in done.stderr
    assert elapsed < 5, f"config check took {elapsed:.1f}s"


def test_a_merge_key_bomb_is_refused(write: WriteFile) -> None:
    path = write(MERGE_BOMB)
    started = time.monotonic()
    problems = _problems(path)
    assert time.monotonic() - started < 5
    assert len(problems) == 1 and f"repeat more than {MAX_REPEATED:,} values" in problems[0]
    assert problems[0].startswith(f"{path}:")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("rules: " + "[" * 5000 + "]" * 5000 + "\n", 1),
        ("rules: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", 1),
        ("rules:\n" + "".join("  " * i + "- \n" for i in range(200)), MAX_DEPTH + 1),
    ],
    ids=["flow lists", "flow mappings", "block lists"],
)
def test_deep_nesting_is_a_problem_not_a_recursion_error(write: WriteFile, text: str, line: int) -> None:
    path = write(text)
    problems = _problems(path)
    assert problems == [
        f"{path}:{line}: the document nests deeper than {MAX_DEPTH} levels of mappings and lists; "
        "a rules file needs far fewer: flatten it"
    ]


def test_nesting_through_aliases_counts_too(write: WriteFile) -> None:
    # Each anchor is 40 deep (within the bound), but the alias puts one inside the other.
    deep = "[" * 40 + "]" * 40
    path = write(f"a: &a {deep}\nb: &b {'[' * 40}*a{']' * 40}\nrules: *b\n")
    assert any(f"nests deeper than {MAX_DEPTH} levels" in p for p in _problems(path))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &a [*a]\nrules: *a\n", f"nests deeper than {MAX_DEPTH} levels"),
        ("a: &a {<<: *a}\nrules: [*a]\n", "a mapping merges itself (through an alias)"),
    ],
    ids=["a list holding itself", "a mapping merging itself"],
)
def test_an_anchor_that_contains_its_own_alias_is_a_problem(write: WriteFile, text: str, message: str) -> None:
    path = write(text)
    problems = _problems(path)
    assert len(problems) == 1 and problems[0].startswith(f"{path}:1: ") and message in problems[0]


def test_an_integer_too_long_to_convert_is_a_problem(write: WriteFile) -> None:
    path = write("rules:\n  - name: a\n    limits: [1/s]\n    burst: " + "9" * 5000 + "\n")
    problems = _problems(path)
    assert problems[0].startswith(f"{path}:4: cannot read this value (Exceeds the limit")


def test_a_file_larger_than_the_bound_is_not_parsed(write: WriteFile) -> None:
    path = write("rules: []\n" + "#" * MAX_FILE_BYTES + "\n")
    assert _problems(path) == [
        f"{path}:1: the rules file is larger than {MAX_FILE_BYTES:,} bytes; a rules file is a few kilobytes: "
        "give the right file, or split it"
    ]


def test_a_rule_with_too_many_limits_is_a_problem(write: WriteFile) -> None:
    limits = ", ".join(f"{n}/s" for n in range(1, 20_002))
    path = write(f"rules:\n  - name: a\n    limits: [{limits}]\n")
    started = time.monotonic()
    problems = _problems(path)
    assert time.monotonic() - started < 5
    assert problems == [f"{path}:3: limits has 20001 limits; a rule takes at most {MAX_LIMITS}"]


def test_aliases_and_merges_within_the_bounds_read_as_the_merge_key_spec_says(write: WriteFile) -> None:
    path = write(
        """
        rules:
          - &a {name: a, limits: [5/s], algorithm: fixed_window}
          - {<<: [{limits: [1/s]}, *a], name: b}
          - {<<: *a, name: c, algorithm: gcra}
        """
    )
    a, b, c = load_rules(path)
    assert (a.rule.algorithm, [str(x) for x in a.rule.limits]) == ("fixed_window", ["5/second"])
    # The first mapping of a merged list wins, as the merge-key spec says (PyYAML 6.0.4 lets the last win).
    assert [str(x) for x in b.rule.limits] == ["1/second"]
    assert b.rule.algorithm == "fixed_window"
    assert (c.rule.algorithm, [str(x) for x in c.rule.limits]) == ("gcra", ["5/second"])


def test_envoy_descriptors_nested_a_dozen_deep_load(write: WriteFile) -> None:
    text = "domain: d\ndescriptors:\n"
    for depth in range(12):
        pad = "  " * (2 * depth)
        text += f"{pad}  - key: k{depth}\n{pad}    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        text += f"{pad}    descriptors:\n"
    text += "  " * 24 + "  - key: last\n"
    config = load_envoy(write(text))
    assert len(config.nodes) == 12


def test_parse_any_reports_the_bomb_once(write: WriteFile) -> None:
    with pytest.raises(ConfigProblems) as info:
        parse_any(BILLION_LAUGHS, "inline")
    assert info.value.problems == (
        f"inline:6: YAML aliases here repeat more than {MAX_REPEATED:,} values in all (each alias copies what "
        "its anchor holds, so nested aliases multiply); write the values out or use fewer aliases",
    )
