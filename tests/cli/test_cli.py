"""The ``ratekeeper`` command: check, demo, --help."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ratekeeper.cli import CLOSED_PIPE_STATUS, main


def test_check_prints_each_decision_and_the_count(capsys: pytest.CaptureFixture[str]) -> None:
    """The login example from the command line: 5 of 7 admitted, the 6th refused by 5/3s."""
    code = main(["check", "-l", "20/minute", "-l", "5/3s", "-a", "sliding_window_log", "-n", "7", "--every", "200ms"])
    out = capsys.readouterr().out
    assert 0 == code
    assert "5 of 7 admitted" in out
    row6 = out.splitlines()[7]
    assert "denied" in row6
    assert "5/3s" in row6
    assert "2.000s" in row6  # the first call (t=0) leaves the window at t=3, 2 s after t=1.0


def test_check_json_lines_are_decisions(capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints one JSON decision per request, with simulated time."""
    assert 0 == main(["check", "-l", "1/3s", "-n", "3", "--every", "1.5s", "--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [True, False, True] == [r["allowed"] for r in rows]
    assert [0.0, 1.5, 3.0] == [r["t"] for r in rows]
    assert 1.5 == rows[1]["retry_after"]


def test_check_refuses_a_malformed_limit_with_the_accepted_forms(capsys: pytest.CaptureFixture[str]) -> None:
    """Bad input on the command line: exit code 2 and a message listing the accepted forms."""
    assert 2 == main(["check", "-l", "twenty a minute"])
    err = capsys.readouterr().err
    assert "cannot parse limit 'twenty a minute'" in err
    assert "20/minute" in err


def test_demo_runs_every_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's first command: six scenarios with their exact outcomes."""
    assert 0 == main(["demo"])
    out = capsys.readouterr().out
    assert "1 admitted, 9 refused with retry_after=3.0s" in out
    assert "call 6: REFUSED by 5/3s, retry in 3.0s (20/minute: 15 left, 5/3s: 0 left)" in out
    assert "200 messages admitted = 1000 tokens of 1000" in out
    assert "0.0s, 0.5s, 1.0s, 1.5s, 2.0s" in out
    assert "acme after billing answered (3/minute): [True, True, True, False]" in out
    assert "admin: unlimited=True" in out


@pytest.mark.parametrize("args", [["--help"], ["check", "--help"], ["demo", "--help"], ["bench", "memory", "--help"]])
def test_help_on_each_command(args: list[str]) -> None:
    """``--help`` works on every command, through the installed entry point's module."""
    result = subprocess.run([sys.executable, "-m", "ratekeeper", *args], capture_output=True, text=True, check=False)
    assert 0 == result.returncode, result.stderr
    assert "usage: ratekeeper" in result.stdout


def run_into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run the real command with its output to a pipe nobody reads any more (``| head``
    after head exited): every write it makes meets EPIPE, whatever its size."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "ratekeeper", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            check=False,
            timeout=60,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "args",
    [
        ["migrate", "--store", "postgresql://app@db.invalid/app?schema=rk", "--print"],
        ["demo"],
        ["check", "-l", "5/3s", "-n", "3"],
        ["config", "check", "RULES"],
    ],
)
def test_output_to_a_closed_pipe_ends_quietly_with_the_sigpipe_status(args: list[str], tmp_path: Path) -> None:
    """``ratekeeper migrate --print | head`` and the like: no traceback, no "Exception
    ignored" at exit, and 128 + SIGPIPE as a shell reports for any tool ended that way."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: api\n    limits: [10/minute]\n")
    result = run_into_a_closed_pipe(*(str(rules) if a == "RULES" else a for a in args))
    assert b"" == result.stderr
    assert CLOSED_PIPE_STATUS == result.returncode == 141


def test_a_usage_error_still_reaches_stderr_when_stdout_is_closed() -> None:
    """Only the closed stream is given up: a mistake on the command line is still told."""
    result = run_into_a_closed_pipe("migrate", "--store", "redis://localhost:6379", "--print")
    assert 2 == result.returncode
    assert b"migrate applies to postgresql:// stores" in result.stderr
