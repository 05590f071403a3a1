"""``ratekeeper bench STORE``: measure ratekeeper against its peers (needs the ``bench`` extra).

The only module of the package that imports ``ratekeeper_bench``, and only when the
command line is built.
"""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]

EPILOG = "What each cell measures, and how to read the report: docs/benchmarks.md."


def _description(summary: str) -> str:
    """A store command's description: what it compares, for ``--help`` (its module's
    docstring is the reference of how it measures, not usage)."""
    return f"Benchmark {summary}; print the results as Markdown tables (--markdown PATH also writes them to PATH)."


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", help="measure ratekeeper against its peers", description="Benchmarks, one store at a time."
    )
    stores = p.add_subparsers(dest="store", required=True, metavar="STORE")
    from ratekeeper_bench import memory

    summary = "the memory store against limits, pyrate-limiter and throttled-py"
    m = stores.add_parser("memory", help=summary, description=_description(summary), epilog=EPILOG)
    memory.add_arguments(m)
    m.set_defaults(bench_run=memory.run)
    from ratekeeper_bench import postgres, redis

    for name, module, summary in (
        ("redis", redis, "the Redis store against limits, pyrate-limiter, throttled-py and the raw redis-py floor"),
        ("postgres", postgres, "the PostgreSQL store against the strategies it replaces and pyrate-limiter"),
    ):
        server = stores.add_parser(name, help=summary, description=_description(summary), epilog=EPILOG)
        module.add_arguments(server)
        server.set_defaults(bench_run=module.run)
    from ratekeeper_bench import web

    summary = "the web middleware against the bare app and slowapi, flask-limiter, django-ratelimit, under wrk"
    w = stores.add_parser("web", help=summary, description=_description(summary), epilog=EPILOG)
    web.add_arguments(w)
    w.set_defaults(bench_run=web.run)
    from ratekeeper_bench import serve

    summary = "the service (ratekeeper serve) under wrk, h2load and a grpcio client: HTTP and gRPC, memory and Redis"
    s = stores.add_parser("serve", help=summary, description=_description(summary), epilog=EPILOG)
    serve.add_arguments(s)
    s.set_defaults(bench_run=serve.run)


def run(args: argparse.Namespace) -> int:
    return int(args.bench_run(args))
