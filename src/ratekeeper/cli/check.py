"""``ratekeeper check``: decide requests for a rule from the command line, to try it out."""

from __future__ import annotations

import argparse
import json
import math
import re

from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.errors import RateKeeperError
from ratekeeper.limit import never_admitted, parse_duration
from ratekeeper.limiter.checks import check
from ratekeeper.limiter.limiter import Limiter
from ratekeeper.rule import DEFAULT_ALGORITHM, Rule
from ratekeeper.testing import FakeClock

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def run(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        raise RateKeeperError(f"--repeat must be at least 1, got {args.repeat}")
    every_us = (
        0 if re.fullmatch(r"\s*0+(\.0*)?\s*[a-zµ]*\s*", args.every, re.IGNORECASE) else parse_duration(args.every)
    )
    rule = Rule(args.name, args.limit, args.algorithm, burst=args.burst)
    # Every refusal of the input comes before the table (and exits non-zero): a cost no
    # limit can ever admit is one, since every row would only repeat it.
    check(rule, args.key, args.cost)
    for limit in rule.limits:
        if args.cost > limit.capacity:
            raise RateKeeperError(never_admitted(args.cost, limit))
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
