"""``ratekeeper bench STORE``: measure ratekeeper against its peers (needs the ``bench`` extra).

The only module of the package that imports ``ratekeeper_bench``, and only when the
command line is built.
"""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", help="measure ratekeeper against its peers", description="Benchmarks, one store at a time."
    )
    stores = p.add_subparsers(dest="store", required=True, metavar="STORE")
    from ratekeeper_bench import memory

    m = stores.add_parser(
        "memory",
        help="the memory store against limits, pyrate-limiter and throttled-py",
        description=memory.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    memory.add_arguments(m)
    m.set_defaults(bench_run=memory.run)
    from ratekeeper_bench import postgres, redis

    for name, module, summary in (
        ("redis", redis, "the Redis store against limits, pyrate-limiter, throttled-py and the raw redis-py floor"),
        ("postgres", postgres, "the PostgreSQL store against the strategies it replaces and pyrate-limiter"),
    ):
        server = stores.add_parser(
            name, help=summary, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(server)
        server.set_defaults(bench_run=module.run)
    from ratekeeper_bench import web

    w = stores.add_parser(
        "web",
        help="the web middleware against the bare app and slowapi, flask-limiter, django-ratelimit, under wrk",
        description=web.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    web.add_arguments(w)
    w.set_defaults(bench_run=web.run)
    from ratekeeper_bench import serve

    s = stores.add_parser(
        "serve",
        help="the service (ratekeeper serve) under wrk, h2load and a grpcio client: HTTP and gRPC, memory and Redis",
        description=serve.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_arguments(s)
    s.set_defaults(bench_run=serve.run)


def run(args: argparse.Namespace) -> int:
    return int(args.bench_run(args))
