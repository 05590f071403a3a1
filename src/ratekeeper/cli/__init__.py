"""The ``ratekeeper`` command. Each subcommand is a module of this package with
``add_parser(subparsers)`` and ``run(args) -> exit status``, listed in ``COMMANDS``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ratekeeper import __version__
from ratekeeper.errors import RateKeeperError

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS = ("check", "config", "demo", "migrate", "serve", "bench")
"""The subcommands, in the order ``--help`` lists them; each names a module of this package."""


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
    args = build_parser().parse_args(argv)
    module = importlib.import_module(f"ratekeeper.cli.{args.command}")
    try:
        return int(module.run(args))
    except RateKeeperError as exc:
        print(f"ratekeeper: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
