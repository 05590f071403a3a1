"""``ratekeeper bench STORE``: measure ratekeeper against its peers.

The harness is ``ratekeeper_bench``, a distribution of its own in the repository
(``bench/``, installed with ``pip install -e ./bench``). This is the only module of the package
that imports it, and only when the command line is built; without it, the command says
how to install it and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_parser", "run"]

EPILOG = "What each cell measures, and how to read the report: docs/benchmarks.md."
INSTALL = (
    "ratekeeper bench needs the benchmark harness, ratekeeper-bench, which is not part of ratekeeper's wheel: "
    "in a clone of the repository, install it with pip install -e ./bench"
)


def _description(summary: str) -> str:
    """A store command's description: what it compares, for ``--help`` (its module's
    docstring is the reference of how it measures, not usage)."""
    return f"Benchmark {summary}; print the results as Markdown tables (--markdown PATH also writes them to PATH)."


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", help="measure ratekeeper against its peers", description="Benchmarks, one store at a time."
    )
    try:
        from ratekeeper_bench import instructions, memory, postgres, redis, serve, web
    except ImportError as exc:  # the harness is not installed: the other commands still work
        p.description = f"{p.description} {INSTALL}."
        p.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        p.set_defaults(bench_missing=str(exc))
        return
    stores = p.add_subparsers(dest="store", required=True, metavar="STORE")

    summary = "the memory store against limits, pyrate-limiter and throttled-py"
    m = stores.add_parser("memory", help=summary, description=_description(summary), epilog=EPILOG)
    memory.add_arguments(m)
    m.set_defaults(bench_run=memory.run)

    for name, module, summary in (
        ("redis", redis, "the Redis store against limits, pyrate-limiter, throttled-py and the raw redis-py floor"),
        ("postgres", postgres, "the PostgreSQL store against the strategies it replaces and pyrate-limiter"),
    ):
        server = stores.add_parser(name, help=summary, description=_description(summary), epilog=EPILOG)
        module.add_arguments(server)
        server.set_defaults(bench_run=module.run)

    summary = "the web middleware against the bare app and slowapi, flask-limiter, django-ratelimit, under wrk"
    w = stores.add_parser("web", help=summary, description=_description(summary), epilog=EPILOG)
    web.add_arguments(w)
    w.set_defaults(bench_run=web.run)

    summary = "the service (ratekeeper serve) under wrk, h2load and a grpcio client: HTTP and gRPC, memory and Redis"
    s = stores.add_parser("serve", help=summary, description=_description(summary), epilog=EPILOG)
    serve.add_arguments(s)
    s.set_defaults(bench_run=serve.run)

    summary = "the web middleware's CPU instructions per request, counted by callgrind (repeatable on a busy machine)"
    i = stores.add_parser("instructions", help=summary, description=_description(summary), epilog=EPILOG)
    instructions.add_arguments(i)
    i.set_defaults(bench_run=instructions.run)


def run(args: argparse.Namespace) -> int:
    missing = getattr(args, "bench_missing", None)
    if missing is not None:
        print(f"ratekeeper: error: {INSTALL} ({missing})", file=sys.stderr)
        return 2
    return int(args.bench_run(args))
