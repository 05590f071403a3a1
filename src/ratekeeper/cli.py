"""The ``ratekeeper`` command: ``check``, ``demo`` and ``bench``."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence

from ratekeeper import __version__
from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.errors import RateKeeperError
from ratekeeper.limit import parse_duration
from ratekeeper.limiter import Limiter
from ratekeeper.rule import DEFAULT_ALGORITHM, Rule
from ratekeeper.testing import FakeClock

__all__ = ["main"]


def _add_check(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check",
        help="decide requests for a rule from the command line, to try a rule out",
        description=(
            "Decide one or more requests for a rule and print each decision. On memory:// the "
            "time between requests (--every) is simulated, so '--repeat 10 --every 0.5s' shows "
            "five seconds of traffic at once."
        ),
        epilog="example: ratekeeper check --limit 20/minute --limit 5/3s --algorithm sliding_window_log --repeat 7",
    )
    p.add_argument("--limit", "-l", action="append", required=True, help="a limit such as 20/minute (repeatable)")
    p.add_argument("--algorithm", "-a", default=DEFAULT_ALGORITHM, choices=sorted(ALGORITHMS))
    p.add_argument("--burst", type=int, default=None, help="bucket capacity (token_bucket, gcra, leaky_bucket)")
    p.add_argument("--name", default="cli", help="rule name (default: cli)")
    p.add_argument("--key", "-k", default="cli-key", help="the key to charge (default: cli-key)")
    p.add_argument("--cost", "-c", type=int, default=1, help="cost of each request (default: 1)")
    p.add_argument("--repeat", "-n", type=int, default=1, help="how many requests to decide (default: 1)")
    p.add_argument("--every", default="0s", help="time between requests, e.g. 500ms (default: 0s)")
    p.add_argument("--store", default="memory://", help="store URL (default: memory://)")
    p.add_argument("--json", action="store_true", help="print one JSON object per decision")


def _run_check(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        raise RateKeeperError(f"--repeat must be at least 1, got {args.repeat}")
    every_us = (
        0 if re.fullmatch(r"\s*0+(\.0*)?\s*[a-zµ]*\s*", args.every, re.IGNORECASE) else parse_duration(args.every)
    )
    rule = Rule(args.name, args.limit, args.algorithm, burst=args.burst)
    simulated = args.store.startswith("memory:")
    clock = FakeClock() if simulated else None
    limiter = Limiter(args.store, clock=clock)
    start = limiter.clock.now_us()
    if not args.json:
        print(f"rule {rule}")
        header = ("#", "t", "decision", "remaining", "retry_after", "reset_after", "delay")
        print("{:>3} {:>9} {:<8} {:>9} {:>11} {:>11} {:>8}  denied_by".format(*header))
    admitted = 0
    for i in range(args.repeat):
        if i and every_us:
            limiter.clock.sleep(every_us / 1_000_000)
        d = limiter.try_acquire(rule, args.key, args.cost)
        admitted += d.allowed
        t = (limiter.clock.now_us() - start) / 1_000_000
        if args.json:
            print(json.dumps({"t": t, **d.as_dict()}))
            continue
        retry = "inf" if math.isinf(d.retry_after) else f"{d.retry_after:.3f}s"
        print(
            f"{i + 1:>3} {t:>8.3f}s {'allowed' if d else 'denied':<8} {d.remaining:>9} {retry:>11} "
            f"{d.reset_after:>10.3f}s {d.delay:>7.3f}s  {d.denied_by or ''}"
        )
    if not args.json:
        print(f"{admitted} of {args.repeat} admitted")
    limiter.close()
    return 0


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser(
        "demo",
        help="walk through what ratekeeper decides in the scenarios it was built for",
        description="Runs the README scenarios on the embedded memory store and prints each decision.",
    )


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", help="measure ratekeeper against its peers", description="Benchmarks, one store at a time."
    )
    stores = p.add_subparsers(dest="store", required=True, metavar="STORE")
    from ratekeeper.bench import memory

    m = stores.add_parser(
        "memory",
        help="the memory store against limits, pyrate-limiter and throttled-py",
        description=memory.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    memory.add_arguments(m)
    m.set_defaults(bench_run=memory.run)
    from ratekeeper.bench import postgres, redis

    for name, module, summary in (
        ("redis", redis, "the Redis store against limits, pyrate-limiter, throttled-py and the raw redis-py floor"),
        ("postgres", postgres, "the PostgreSQL store against the strategies it replaces and pyrate-limiter"),
    ):
        server = stores.add_parser(
            name, help=summary, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(server)
        server.set_defaults(bench_run=module.run)


def _add_migrate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "migrate",
        help="create or update a server store's schema (PostgreSQL)",
        description=(
            "Create the schema, the state table and the functions of the PostgreSQL store, or "
            "bring the functions up to date. Idempotent: running it again changes nothing. "
            "The store also does this on first use; run it ahead when the application's "
            "database user may not create objects."
        ),
        epilog="example: ratekeeper migrate --store 'postgresql://app@db/app?schema=ratekeeper&unlogged=true'",
    )
    p.add_argument("--store", required=True, help="store URL, e.g. postgresql://user@host:5432/dbname?schema=...")
    p.add_argument("--print", action="store_true", help="print the SQL instead of running it")


def _run_migrate(args: argparse.Namespace) -> int:
    from urllib.parse import urlsplit

    from ratekeeper.stores.postgres_core import POSTGRES_SCHEMES, PostgresOptions, migration_sql

    if urlsplit(args.store).scheme.lower() not in POSTGRES_SCHEMES:
        raise RateKeeperError(
            f"migrate applies to postgresql:// stores (the others need no schema), got {args.store!r}"
        )
    if args.print:
        opts = PostgresOptions(args.store)
        print(migration_sql(opts.schema, opts.table, opts.unlogged))
        return 0
    from ratekeeper.stores.postgres import PostgresStore

    store = PostgresStore(args.store)
    try:
        store.migrate()
    finally:
        store.close()
    opts = store.core.options
    print(f"schema {opts.schema}, table {opts.schema}.{opts.table}: up to date")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ratekeeper",
        description="Exact rate limits for one process or a fleet.",
    )
    parser.add_argument("--version", action="version", version=f"ratekeeper {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_check(sub)
    _add_demo(sub)
    _add_bench(sub)
    _add_migrate(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "check":
            return _run_check(args)
        if args.command == "demo":
            from ratekeeper.demo import run_demo

            return run_demo(sys.stdout)
        if args.command == "migrate":
            return _run_migrate(args)
        if args.command == "bench":
            return int(args.bench_run(args))
    except RateKeeperError as exc:
        print(f"ratekeeper: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
