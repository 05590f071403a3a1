"""``ratekeeper loadtest [FILE]``: an open-loop load generator for an endpoint behind a
limiter, with results, charts and a verdict per profile (needs the ``loadtest`` extra;
docs/loadtest.md). The engine, ``ratekeeper.loadtest``, is imported only when the
command line is built."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "loadtest",
        help="load an endpoint behind a limiter: results, charts, a verdict per profile",
        description=(
            "Send each profile's requests on its own schedule (open loop), whatever the answers' latency; "
            "write results.tsv, summary.json, HDR logs and charts in --out. Without FILE, start the built-in "
            "scenario's app and load it."
        ),
        epilog="Profiles, outputs and how to read them: docs/loadtest.md.",
    )
    try:
        from ratekeeper.loadtest.cli import add_arguments
    except ImportError as exc:  # the loadtest extra is missing: the other commands still work
        p.set_defaults(loadtest_missing=str(exc))
        return
    add_arguments(p)


def run(args: argparse.Namespace) -> int:
    missing = getattr(args, "loadtest_missing", None)
    if missing is not None:
        print(f"ratekeeper loadtest needs the loadtest extra (pip install 'ratekeeper[loadtest]'): {missing}")
        return 2
    from ratekeeper.loadtest.cli import run as run_loadtest

    return run_loadtest(args)
