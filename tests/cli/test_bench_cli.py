"""``ratekeeper bench`` without the harness installed: it says how to install it."""

from __future__ import annotations

import sys

import pytest

from ratekeeper.cli import main


@pytest.fixture
def no_harness(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import ratekeeper_bench`` fails, as in an environment without ratekeeper-bench."""
    monkeypatch.setitem(sys.modules, "ratekeeper_bench", None)


@pytest.mark.usefixtures("no_harness")
def test_bench_without_the_harness_says_how_to_install_it_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert 2 == main(["bench", "memory", "--quick"])
    err = capsys.readouterr().err
    assert "ratekeeper-bench" in err
    assert "pip install -e ./bench" in err


@pytest.mark.usefixtures("no_harness")
def test_bench_help_without_the_harness_says_how_to_install_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--help"])
    assert 0 == exit_.value.code
    assert "pip install -e ./bench" in " ".join(capsys.readouterr().out.split())


@pytest.mark.usefixtures("no_harness")
def test_the_other_commands_work_without_the_harness(capsys: pytest.CaptureFixture[str]) -> None:
    assert 0 == main(["check", "-l", "5/3s", "-n", "1"])
    assert capsys.readouterr().out
