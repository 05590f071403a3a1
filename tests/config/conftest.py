"""Helpers for the rules-file tests: write a YAML text to a file and load or fail it."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

WriteFile = Callable[..., Path]


@pytest.fixture
def write(tmp_path: Path) -> WriteFile:
    """``write(text, name="rules.yaml")``: the dedented text in a file of tmp_path."""

    def _write(text: str, name: str = "rules.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return _write
