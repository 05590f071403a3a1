"""``ratekeeper bench instructions``: what one request through the web middleware costs, in
CPU instructions counted by callgrind (valgrind), which repeat to within half a percent
whatever else the machine is doing, where wall-clock rates on a shared machine move by
tens of percent between identical runs.

Each case (``instructions_driver.CASES``) runs in a fresh interpreter under ``valgrind
--tool=callgrind`` twice, sending ``N`` requests and none after the same warm-up; the
difference over ``N`` is one request's instructions, start-up and warm-up cancelled out.
``PYTHONHASHSEED=0`` keeps dict layouts, hence the counts, the same from run to run.
``--src PATH`` measures another checkout's ``src`` (e.g. a ``git worktree`` of an earlier
commit) with the same driver, so a change is measured before and after in one run.

Reported per case: instructions per request, and the middleware's share (the case less
the same interface's bare case: the driver's loop and the raw app).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ratekeeper_bench.instructions_driver import CASES
from ratekeeper_bench.options import count

DEFAULT_REQUESTS = 1000
_COLLECTED = re.compile(r"Collected : (\d+)")


@dataclass(slots=True)
class InstructionsResult:
    requests: int
    source: str
    per_request: dict[str, int] = field(default_factory=dict)
    failures: list[tuple[str, str]] = field(default_factory=list)

    def to_markdown(self) -> str:
        lines = [
            "## Web middleware: instructions per request (callgrind)",
            "",
            f"{self.requests} requests after a warm-up, counted against a run of none; "
            f"ratekeeper from {self.source}; memory store, one `{{client_ip}}` rule (GCRA), headers on.",
            "",
            "| case | what | instructions per request | the middleware's (less bare) |",
            "| --- | --- | ---: | ---: |",
        ]
        for case, count_ in self.per_request.items():
            bare = self.per_request.get(case.split("_")[0] + "_bare")
            share = "" if bare is None or case.endswith("_bare") else f"{count_ - bare:,}"
            lines.append(f"| {case} | {CASES[case]} | {count_:,} | {share} |")
        for case, error in self.failures:
            lines.append(f"| {case} | failed: {error} | | |")
        return "\n".join(lines) + "\n"


def collected(case: str, n: int, src: Path | None, workdir: Path) -> int:
    """The instructions callgrind counted for one run of the driver."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH", "")) if p)
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={workdir / f'{case}.{n}.out'}",
        sys.executable,
        "-m",
        "ratekeeper_bench.instructions_driver",
        case,
        str(n),
    ]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=False)
    found = _COLLECTED.search(run.stderr)
    if run.returncode != 0 or found is None:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"valgrind exited {run.returncode}: {tail}")
    return int(found.group(1))


def measure(cases: list[str], requests: int, src: Path | None) -> InstructionsResult:
    result = InstructionsResult(requests, f"`{src}`" if src is not None else "the installed package")
    with tempfile.TemporaryDirectory(prefix="rk-instructions-") as tmp:
        for case in cases:
            print(f"  {case} ...", file=sys.stderr, flush=True)
            try:
                many = collected(case, requests, src, Path(tmp))
                none = collected(case, 0, src, Path(tmp))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                result.failures.append((case, str(exc)))
                continue
            result.per_request[case] = (many - none) // requests
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--requests", type=count(1), default=DEFAULT_REQUESTS, metavar="N", help="requests counted per case (1000)"
    )
    parser.add_argument(
        "--case",
        action="append",
        dest="cases",
        choices=tuple(CASES),
        metavar="CASE",
        help=f"measure only this case (repeatable): {', '.join(CASES)}",
    )
    parser.add_argument(
        "--src",
        type=Path,
        default=None,
        metavar="PATH",
        help="measure the ratekeeper package under PATH (another checkout's src) instead of the installed one",
    )
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH", help="also write the table to PATH")


def run(args: argparse.Namespace) -> int:
    if shutil.which("valgrind") is None:
        print("ratekeeper bench instructions: valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    src: Path | None = args.src
    if src is not None and not (src / "ratekeeper" / "__init__.py").is_file():
        print(f"ratekeeper bench instructions: --src {src} holds no ratekeeper package", file=sys.stderr)
        return 2
    result = measure(list(args.cases or CASES), args.requests, src)
    text = result.to_markdown()
    sys.stdout.write(text)
    if args.markdown is not None:
        args.markdown.write_text(text, encoding="utf-8")
    return 1 if result.failures else 0
