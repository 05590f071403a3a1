"""``ratekeeper demo``: the scenarios ratekeeper was built for, decided on the memory store.

Time is simulated (a ``FakeClock``) so the walk-through takes a second, not minutes;
the concurrency is real (threads).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from typing import TextIO

from ratekeeper.limiter.limiter import Limiter
from ratekeeper.quota import Quota
from ratekeeper.rule import Rule
from ratekeeper.testing import FakeClock

__all__ = ["add_parser", "run", "run_demo"]


def _concurrent(n: int, call: object) -> list[object]:
    results: list[object] = [None] * n
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        barrier.wait()
        results[i] = call()  # type: ignore[operator]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def run_demo(out: TextIO) -> int:
    """Print the walk-through to ``out``; what the ``ratekeeper`` logger says meanwhile is
    printed there too, in place, as a log line (not a stray line on stderr)."""
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("   log: %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("ratekeeper")
    logger.addHandler(handler)
    try:
        return _walk_through(out)
    finally:
        logger.removeHandler(handler)


def _walk_through(out: TextIO) -> int:
    clock = FakeClock()
    limiter = Limiter("memory://", clock=clock)

    def say(text: str = "") -> None:
        print(text, file=out)

    say("1. A partner may call the heavy endpoint once every 3 seconds; 10 requests arrive at once.")
    partner = Rule("portal.export", ["1/3s"], algorithm="gcra")
    decisions = _concurrent(10, lambda: limiter.try_acquire(partner, "partner-17"))
    admitted = sum(bool(d) for d in decisions)
    retry = max(d.retry_after for d in decisions if not d)  # type: ignore[attr-defined]
    say(f"   {admitted} admitted, {10 - admitted} refused with retry_after={retry:.1f}s")

    say()
    say("2. Logins: 20 per minute and never more than 5 in any 3 seconds, checked together.")
    login = Rule("auth.create_token", ["20/minute", "5/3s"], algorithm="sliding_window_log")
    for i in range(1, 7):
        d = limiter.try_acquire(login, "user-42")
        per_limit = ", ".join(f"{s.limit}: {s.remaining} left" for s in d.limits)
        verdict = "allowed" if d else f"REFUSED by {d.denied_by}, retry in {d.retry_after:.1f}s"
        say(f"   call {i}: {verdict} ({per_limit})")
    clock.advance(3)
    d = limiter.try_acquire(login, "user-42")
    say(f"   3 s later: {'allowed' if d else 'refused'} ({d.limits[0].remaining} left this minute)")

    say()
    say("3. Weighted messages on a hot key: token bucket 1000/s, 8 threads sending 50 messages of cost 5.")
    messages = Rule("bot.send", ["1000/s"], algorithm="token_bucket")
    results = _concurrent(8, lambda: sum(limiter.try_acquire(messages, "big-customer", 5).allowed for _ in range(50)))
    total = sum(results)  # type: ignore[arg-type]
    say(f"   {total} messages admitted = {total * 5} tokens of 1000 (exact under contention)")

    say()
    say("4. Shaping outgoing calls: leaky bucket 2/s; five workers call acquire() at once.")
    outgoing = Rule("partner-api", ["2/s"], algorithm="leaky_bucket", burst=10)
    starts = []
    for _ in range(5):
        d = limiter.try_acquire(outgoing, "partner-api")
        starts.append(d.delay)
    say(f"   each is told to wait: {', '.join(f'{s:.1f}s' for s in starts)} (first come, first served, evenly spaced)")

    say()
    say("5. Per-customer quotas from billing; unknown customers get the failsafe, admins are exempt.")
    billing = {"acme": ["3/minute"], "admin": None}
    quota = Quota(lambda customer: billing[customer], ttl=60, clock=clock)
    api = Rule("api.calls", ["1/minute"], quota=quota)
    first = limiter.try_acquire(api, "acme")
    say(f"   acme before billing answered: failsafe {first.limit}")
    quota.wait_idle()
    limiter.reset(api, "acme")
    acme = [bool(limiter.try_acquire(api, "acme")) for _ in range(4)]
    say(f"   acme after billing answered (3/minute): {acme}")
    limiter.try_acquire(api, "admin")
    quota.wait_idle()
    admin = limiter.try_acquire(api, "admin")
    say(f"   admin: unlimited={admin.unlimited}")
    unknown = [limiter.try_acquire(api, "nobody")]
    quota.wait_idle()
    unknown.append(limiter.try_acquire(api, "nobody"))
    say(
        f"   unknown customer (billing raised KeyError, logged): failsafe {unknown[1].limit} kept, "
        f"{sum(map(bool, unknown))} of 2 calls admitted"
    )
    quota.close()

    say()
    say("6. At most 2 report jobs in flight per tenant; a crashed holder's lease expires.")
    jobs = Rule("reports", ["2/30s"], algorithm="concurrency")
    with limiter.lease(jobs, "tenant-1"), limiter.lease(jobs, "tenant-1"):
        d = limiter.try_acquire(jobs, "tenant-1")
        say(f"   third job while two run: {'allowed' if d else f'refused, a slot frees within {d.retry_after:.0f}s'}")
    say(f"   after both finish: {'allowed' if limiter.try_acquire(jobs, 'tenant-1') else 'refused'}")
    limiter.close()
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser(
        "demo",
        help="walk through what ratekeeper decides in the scenarios it was built for",
        description="Runs the README scenarios on the embedded memory store and prints each decision.",
    )


def run(args: argparse.Namespace) -> int:
    return run_demo(sys.stdout)
