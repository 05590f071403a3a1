"""``ratekeeper bench instructions``: callgrind's count of one request through the middleware."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ratekeeper_bench import instructions
from ratekeeper_bench.instructions_driver import CASES

pytestmark = pytest.mark.slow  # a benchmark run

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed (apt-get install valgrind)")
def test_a_limited_request_counts_more_than_the_bare_app_and_the_same_twice() -> None:
    first = instructions.measure(["wsgi_bare", "wsgi_one"], 50, SRC)
    again = instructions.measure(["wsgi_one"], 50, SRC)
    assert [] == first.failures
    bare, one = first.per_request["wsgi_bare"], first.per_request["wsgi_one"]
    assert 0 < bare < one
    # counted, not timed: a second run agrees to within a percent whatever the machine does
    assert abs(again.per_request["wsgi_one"] - one) <= one // 100
    table = first.to_markdown()
    assert f"| wsgi_one | {CASES['wsgi_one']} | {one:,} | {one - bare:,} |" in table


def test_every_case_of_the_driver_runs_and_a_bad_source_is_refused(tmp_path: Path) -> None:
    for case in CASES:  # without valgrind: the driver itself, a few requests each
        driver = [sys.executable, "-m", "ratekeeper_bench.instructions_driver", case, "3"]
        subprocess.run(driver, check=True, timeout=60)
    refused = subprocess.run(
        [sys.executable, "-m", "ratekeeper", "bench", "instructions", "--src", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 2 == refused.returncode
    assert f"--src {tmp_path} holds no ratekeeper package" in refused.stderr
