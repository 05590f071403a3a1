"""What every ``ratekeeper bench`` command shares: its common options and their parsers."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = [
    "add_common_options",
    "add_peer_option",
    "add_scenario_option",
    "choose",
    "command_main",
    "count",
    "describe",
    "finish",
    "or_default",
    "positive_float",
]


def describe(exc: BaseException) -> str:
    """An exception in one table-safe line of at most 160 characters."""
    text = f"{type(exc).__name__}: {exc}".replace("|", "/").replace("\n", " ")
    return text if len(text) <= 160 else text[:157] + "..."


def choose(values: Sequence[str] | None, known: Sequence[str], what: str) -> tuple[str, ...]:
    """The ``values`` asked for (all of ``known`` when none), in ``known``'s order, once each."""
    if not values:
        return tuple(known)
    chosen: list[str] = []
    for value in values:
        if value not in known:
            raise ValueError(f"unknown {what} {value!r}; choose from: {', '.join(known)}")
        if value not in chosen:
            chosen.append(value)
    return tuple(v for v in known if v in chosen)


def positive_float(text: str) -> float:
    """argparse type: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def count(minimum: int) -> Callable[[str], int]:
    """argparse type: a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def add_common_options(
    parser: argparse.ArgumentParser,
    *,
    duration: float,
    quick_duration: float,
    keys: int,
    quick_keys: int,
    keys_help: str = "keys of the many_keys scenario",
) -> None:
    """``--duration``, ``--keys``, ``--markdown``, ``--quick`` and ``--no-progress``, as every
    bench command takes them (``--duration`` and ``--keys`` default to None: the command
    picks its default or its ``--quick`` value)."""
    parser.add_argument(
        "--duration",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help=f"seconds per cell (default {duration:g}; {quick_duration:g} with --quick)",
    )
    parser.add_argument(
        "--keys",
        type=count(1),
        default=None,
        metavar="N",
        help=f"{keys_help} (default {keys:,}; {quick_keys:,} with --quick)",
    )
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH", help="also write the tables to PATH")
    parser.add_argument("--quick", action="store_true", help="tiny duration and key counts, for tests")
    parser.add_argument("--no-progress", action="store_false", dest="progress", help="print no progress")


def add_load_options(
    parser: argparse.ArgumentParser,
    *,
    per_round: str,
    durations: tuple[int, int],
    rounds: tuple[int, int],
    connections: int,
) -> None:
    """``--duration`` and ``--rounds`` (defaults None: the command picks its default or its
    ``--quick`` value, given here as ``(default, quick)`` for the help) and ``--connections``,
    as the commands that load a server (``bench web``, ``bench serve``) take them."""
    parser.add_argument(
        "--duration",
        type=count(1),
        default=None,
        metavar="SECONDS",
        help=f"whole seconds {per_round} (default {durations[0]}; {durations[1]} with --quick)",
    )
    parser.add_argument(
        "--rounds",
        type=count(1),
        default=None,
        metavar="N",
        help=f"rounds per case, the median reported (default {rounds[0]}; {rounds[1]} with --quick)",
    )
    parser.add_argument(
        "--connections", type=count(1), default=connections, metavar="N", help=f"wrk -c (default {connections})"
    )


def add_server_run_options(parser: argparse.ArgumentParser, *, pin_help: str) -> None:
    """``--no-pin``, ``--markdown``, ``--quick`` and ``--no-progress`` of the server loads."""
    parser.add_argument("--no-pin", action="store_false", dest="pin", help=pin_help)
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH", help="also write the tables to PATH")
    parser.add_argument("--quick", action="store_true", help="1 s per case, one round, no warm-up: for tests")
    parser.add_argument("--no-progress", action="store_false", dest="progress", help="print no progress")


def add_scenario_option(parser: argparse.ArgumentParser, scenarios: Sequence[str]) -> None:
    """``--scenario NAME`` (repeatable, into ``args.scenarios``), one of ``scenarios``."""
    parser.add_argument(
        "--scenario",
        action="append",
        dest="scenarios",
        choices=scenarios,
        metavar="NAME",
        help=f"run only this scenario (repeatable): {', '.join(scenarios)}",
    )


def add_peer_option(
    parser: argparse.ArgumentParser,
    option: str,
    dest: str,
    choices: Sequence[str],
    names: Sequence[str],
    what: str = "library",
) -> None:
    """``option NAME`` (repeatable, into ``args.<dest>``): a peer (a ``what``) to compare
    ratekeeper with, one of ``choices``; the help lists ``names``."""
    parser.add_argument(
        option,
        action="append",
        dest=dest,
        choices=choices,
        metavar="NAME",
        help=f"compare only with this {what} (repeatable): {', '.join(names)}; ratekeeper always runs",
    )


def or_default(value: T | None, quick: bool, default: T, quick_default: T) -> T:
    """``value`` when an option gave it, else the command's ``--quick`` or usual default."""
    if value is not None:
        return value
    return quick_default if quick else default


def command_main(
    argv: Sequence[str] | None,
    prog: str,
    description: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
) -> int:
    """Parse ``argv`` with a parser for ``prog`` given ``add_arguments``; ``run``'s exit status."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def finish(result: Any, markdown: Path | None) -> int:
    """Write ``result``'s tables to ``markdown`` when asked; the exit status: 1 if a cell or
    step failed, else 0."""
    if markdown is not None:
        markdown.write_text(result.to_markdown(), encoding="utf-8")
    return 1 if result.failures else 0
