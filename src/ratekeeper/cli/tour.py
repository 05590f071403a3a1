"""``ratekeeper tour``: the whole product in about a minute, on the memory store: the
service with the example rules, four scenarios through its HTTP API with what each
showed, charts, then the service keeps serving (docs/tour.md). Needs the ``server`` and
``loadtest`` extras; the tour's modules are imported when it runs."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_parser", "run"]

OFF = "off"
HELP = "a one-minute tour: the service, four scenarios over HTTP, what each shows, charts"
DESCRIPTION = (
    "Start the service (ratekeeper serve, the memory store, the example rules and two more), run four "
    "scenarios against it through POST /v1/check: a partner endpoint at one per 2 s, the stacked login "
    "limits 20/minute and 5/3s, a hot key, a flood of unique keys under a quota; print what each "
    "showed, write charts (PNG) and the per-second results in --out, then keep serving until Ctrl-C."
)


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port number, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port from 0 to 65535, got {port}")
    return port


def _grpc_port(value: str) -> str:
    return OFF if value.strip().lower() == OFF else str(_port(value))


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    epilog = "What each scenario shows and how to read the charts: docs/tour.md."
    p = sub.add_parser("tour", help=HELP, description=DESCRIPTION, epilog=epilog)
    p.add_argument(
        "--out",
        type=Path,
        default=Path("ratekeeper-tour"),
        metavar="DIR",
        help="where the charts, results, rules and the service's log go (default: ratekeeper-tour)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a few seconds instead of about a minute: fewer windows and bursts, shorter floods",
    )
    p.add_argument(
        "--exit", action="store_true", dest="exit_after", help="stop the service after the tour instead of serving on"
    )
    p.add_argument(
        "--http-port", type=_port, default=8080, help="decision surface HTTP port (default: 8080; 0 picks a free one)"
    )
    p.add_argument(
        "--grpc-port", type=_grpc_port, default="8081", help="gRPC port (default: 8081; 0 picks a free one; off)"
    )
    p.add_argument(
        "--admin-port", type=_port, default=8082, help="admin surface HTTP port (default: 8082; 0 picks a free one)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        from ratekeeper.tour.run import TourOptions, run_tour
    except ImportError as exc:  # an extra is missing: the other commands still work
        extras = "pip install 'ratekeeper[server,loadtest]'"
        print(f"ratekeeper tour needs the server and loadtest extras ({extras}): {exc}")
        return 2
    return run_tour(TourOptions(args.out, args.http_port, args.grpc_port, args.admin_port, args.quick, args.exit_after))
