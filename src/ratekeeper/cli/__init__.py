"""The ``ratekeeper`` command. Each subcommand is a module of this package with
``add_parser(subparsers)`` and ``run(args) -> exit status``, listed in ``COMMANDS``."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from ratekeeper import __version__
from ratekeeper.errors import RateKeeperError

__all__ = ["CLOSED_PIPE_STATUS", "COMMANDS", "build_parser", "main"]

COMMANDS = ("tour", "check", "config", "demo", "migrate", "serve", "bench", "loadtest")
"""The subcommands, in the order ``--help`` lists them; each names a module of this package."""

CLOSED_PIPE_STATUS = 128 + signal.SIGPIPE.value if hasattr(signal, "SIGPIPE") else 1
"""The exit status when the reader of the output went away (``ratekeeper ... | head``):
what a shell reports for a program that SIGPIPE ended (141 on Linux), so ``pipefail``
scripts see the same as with any other tool; 1 where there is no SIGPIPE."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ratekeeper",
        description="Exact rate limits for one process or a fleet.",
    )
    parser.add_argument("--version", action="version", version=f"ratekeeper {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"ratekeeper.cli.{name}")
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status. Output to a closed pipe ends the command quietly."""
    try:
        try:
            status = _run(argv)
        except SystemExit:  # --help, --version and usage errors print, then exit
            _flush()
            raise
        _flush()
        return status
    except BrokenPipeError:
        _silence_closed_streams()
        return CLOSED_PIPE_STATUS


def _run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(f"ratekeeper.cli.{args.command}")
    try:
        return int(module.run(args))
    except RateKeeperError as exc:
        print(f"ratekeeper: error: {exc}", file=sys.stderr)
        return 2


def _flush() -> None:
    # Flushed here, the closed pipe raises where it is handled, not at interpreter exit
    # (where Python prints "Exception ignored ... BrokenPipeError").
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


def _silence_closed_streams() -> None:
    # The buffered rest of the output cannot be written; pointing the descriptors at
    # /dev/null lets the interpreter's final flush succeed instead of raising again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in (sys.stdout, sys.stderr):
            try:
                fd = stream.fileno() if stream is not None else -1
            except (OSError, ValueError):  # a stream without a descriptor (a test's capture)
                continue
            if fd >= 0:
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
