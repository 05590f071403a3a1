"""The partner portal demo: two instances of the items service, one store, the rising load.

    python examples/partner_portal/run.py                      # PostgreSQL, the ten-minute ramp
    python examples/partner_portal/run.py --speed 10           # the same ramp in one minute
    python examples/partner_portal/run.py --store redis --short

It starts two uvicorn processes of ``app.py`` on free loopback ports, both on the same store
(PostgreSQL in a schema of this run's own, dropped at the end; or Redis under a key prefix of
its own, deleted at the end), drives 5, then 50, then 100 requests/s at each instance at once
(3, 3 and 4 minutes, divided by ``--speed``), spread over ``--users`` users, and reports
admitted against the bound per user and in total, errors, latency against the unlimited
route, PostgreSQL's deadlock and lock-wait counters, and the chart. Exit status 1 when a user
was admitted above its bound, a request failed, or PostgreSQL saw a deadlock or a lock wait.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, run from anywhere

from load import RAMP, drive, schedule
from pgwatch import PgWatcher
from report import chart, print_report, summarize

HERE = Path(__file__).resolve().parent
# --short: the ramp in 9.4 s. Chosen so that each user's span of sends (8.8 to 9.4 s)
# sits between two steps of the bound (1 + floor(span / 2) = 5): about half a second of latency
# at either end can neither lift the bound to 6 nor push the fifth admission past the last send,
# so the test can ask for exactly the bound on a loaded machine.
SHORT_SPEED = 600 / 9.4
SHORT_USERS = 3  # also the default: each user then asks far more often than once per 2 s
START_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_instance(store: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "PARTNER_PORTAL_STORE": store}
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "app:app",
        "--app-dir",
        str(HERE),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"instance {url} exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1.0) as answer:
                if answer.status == 200:
                    return
        except OSError:  # refused while uvicorn starts (urllib.error.URLError is an OSError)
            pass
        time.sleep(0.05)
    raise SystemExit(f"instance {url} did not answer /health within {START_TIMEOUT:.0f} s")


def stop_instance(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def open_store(args: argparse.Namespace, run_id: str, stack: ExitStack) -> str:
    """The store URL both instances share, ready to use; its cleanup registered on ``stack``."""
    if args.store == "redis":
        import redis

        url = f"{args.redis}?prefix={run_id}:"

        def drop_keys() -> None:
            client = redis.Redis.from_url(args.redis)
            keys = list(client.scan_iter(match=f"{run_id}:*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()

        stack.callback(drop_keys)
        return url
    import psycopg

    from ratekeeper.stores.postgres.store import PostgresStore

    # application_name marks the run's connections for the lock-wait sampler
    url = f"{args.pg}?schema={run_id}&application_name={run_id}"

    def drop_schema() -> None:
        with psycopg.connect(args.pg, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {run_id} CASCADE")

    stack.callback(drop_schema)
    # installed once here: two instances creating it on their first request would race for it
    store = PostgresStore(url)
    store.migrate()
    store.close()
    return url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["postgres", "redis"], default="postgres")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test", help="PostgreSQL URL")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis URL")
    parser.add_argument("--speed", type=float, default=1.0, help="compress the ramp's time N-fold")
    parser.add_argument("--short", action="store_true", help="the ramp in 9.4 s (for tests)")
    parser.add_argument("--users", type=int, default=None, help="users the load is spread over (3)")
    parser.add_argument("--floor-rate", type=float, default=5.0, help="requests/s per instance to the unlimited route")
    parser.add_argument("--out", type=Path, default=Path("partner_portal_out"), help="summary.json, chart.png, logs")
    args = parser.parse_args(argv)
    # a TERM (a CI timeout, kill) unwinds like Ctrl-C: the instances stop, the schema is dropped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    speed = SHORT_SPEED if args.short else args.speed
    users = [f"user-{n}" for n in range(args.users or SHORT_USERS)]
    phases = [(rate, seconds / speed) for rate, seconds in RAMP]
    run_seconds = sum(length for _, length in phases)
    times = schedule(RAMP, speed)
    floor_times = schedule(((args.floor_rate, run_seconds * speed),), speed)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "instances.log"
    log.write_text("")
    run_id = f"partner_{os.getpid()}_{uuid.uuid4().hex[:8]}"

    pg: dict[str, Any] | None = None
    with ExitStack() as stack:
        store = open_store(args, run_id, stack)
        instances = [start_instance(store, log) for _ in range(2)]
        for proc, _ in instances:
            stack.callback(stop_instance, proc)
        for proc, url in instances:
            wait_ready(proc, url, log)
        urls = [url for _, url in instances]
        print(
            f"{args.store}: two instances {', '.join(urls)}; {len(users)} users; "
            + ", ".join(f"{rate:g}/s for {length:g} s" for rate, length in phases)
            + " per instance",
            flush=True,
        )
        every = max(1.0, run_seconds / 20)  # about twenty progress lines in a run
        if args.store == "postgres":
            with PgWatcher(args.pg, run_id) as watch:
                samples = asyncio.run(drive(urls, times, floor_times, users, progress_every=every))
            pg = watch.as_dict()
        else:
            samples = asyncio.run(drive(urls, times, floor_times, users, progress_every=every))

    summary = summarize(samples, run_seconds)
    summary.update(run_id=run_id, store=args.store, speed=speed, phases=phases, postgres=pg)
    print_report(summary, pg)
    chart(samples, phases, args.out / "chart.png")
    problems = []
    if summary["users_above_bound"]:
        problems.append(f"admitted above the bound: {summary['users_above_bound']}")
    if summary["total"]["errors"] or summary["total"]["floor_errors"]:
        problems.append("requests failed")
    if pg is not None and (pg["deadlocks_moved"] or pg["lock_waits_reaching_deadlock_timeout"] or pg["errors"]):
        problems.append("PostgreSQL counted a deadlock, a lock wait reached deadlock_timeout, or sampling failed")
    summary["problems"] = problems
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"\n{len(summary['users_at_bound'])} of {len(summary['users'])} users admitted exactly their bound; "
        f"chart: {args.out / 'chart.png'}; summary: {args.out / 'summary.json'}"
    )
    print("VERDICT: " + ("ok: never above the bound, no errors" if not problems else "; ".join(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
