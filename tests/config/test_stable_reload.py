"""Reloads that are stable: a rules file is parsed off the reader's thread, and taken only
once it has stood still (same signature and bytes over the settle interval) and loaded;
a file rewritten in place is never taken half-written, also by the middleware under a
real uvicorn."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratekeeper.config import RuleSet, RulesWatcher, load_rules, settled
from ratekeeper.config.settled import Unsettled, load_settled
from ratekeeper.config.watcher import FORCED_ROUNDS
from ratekeeper.web import RateLimitMiddleware
from servers import wait_until
from web.uvicorn_server import serve

FILLERS = [f"f{i}" for i in range(12)]


def rules_text(limit: str, last: str = "last") -> str:
    """Twelve filler rules, then ``last``: a file cut anywhere before its end that still
    reads is a file without ``last``."""
    text = "rules:\n"
    for name in FILLERS:
        text += f"  - name: {name}\n    match: {{path: /other/{name}}}\n    limits: [{limit}]\n"
    return (
        text
        + f'  - name: {last}\n    match: {{path: "/items/{{user}}"}}\n    key: "{{path.user}}"\n    limits: [{limit}]\n'
    )


def rewrite_in_place(path: Path, text: str) -> None:
    """Truncate, then write line by line, each line visible at once and the next a moment
    later: a program writing its output with ``open(path, "w")``, which a reader catches
    half-way if it looks during the few milliseconds the rewrite takes."""
    with path.open("w", encoding="utf-8") as f:
        for line in text.splitlines(keepends=True):
            f.write(line)
            f.flush()
            time.sleep(0.0002)


@contextmanager
def rewriting(path: Path, texts: list[str], pause: Callable[[int], float]) -> Iterator[list[int]]:
    """A thread rewriting ``path`` in place with each text in turn until the block ends,
    waiting ``pause(i)`` seconds after rewrite ``i``; yields the count of rewrites."""
    stop = threading.Event()
    count = [0]

    def loop() -> None:
        while not stop.is_set():
            rewrite_in_place(path, texts[count[0] % len(texts)])
            count[0] += 1
            stop.wait(pause(count[0]))

    thread = threading.Thread(target=loop, name="rewriter", daemon=True)
    thread.start()
    try:
        yield count
    finally:
        stop.set()
        thread.join(10)


def names(rules: RuleSet) -> set[str]:
    return {r.name for r in rules}


def limits(rules: RuleSet) -> set[str]:
    return {str(x) for r in rules for x in r.rule.limits}


def test_a_file_rewritten_in_place_is_never_taken_half_written(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(rules_text("1/s"))
    reloads: list[bool] = []
    watcher = RulesWatcher(
        path, loader=load_rules, interval=0.0, settle=0.1, on_reload=lambda ok, _: reloads.append(ok)
    )
    everything = {*FILLERS, "last"}
    looks = 0
    # Mostly rewritten faster than the file settles, now and then left alone long enough
    # to be taken: the reads race the writes all along.
    with rewriting(path, [rules_text("2/s"), rules_text("3/s")], lambda i: 0.3 if i % 8 == 0 else 0.01) as count:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            current = watcher.current
            assert names(current) == everything, f"a reader got {sorted(names(current))}"
            looks += 1
            time.sleep(0.001)
    assert count[0] > 20 and looks > 500
    final = "2/second" if count[0] % 2 == 1 else "3/second"
    wait_until(lambda: watcher.current and watcher.wait_idle(5) and limits(watcher.current) == {final}, 10, "the last")
    assert names(watcher.current) == everything
    # Some were taken, each whole. A writer stalled mid-write for longer than the settle
    # interval (a loaded machine) leaves a half-written file that looks settled: that one is
    # refused by validation, never taken, and readers kept the rules in force (checked above).
    assert True in reloads, reloads


def test_the_file_is_parsed_on_a_worker_thread_and_readers_keep_the_old_rules_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(rules_text("1/s"))
    loading = threading.Event()
    release = threading.Event()
    threads: list[threading.Thread] = []

    def slow_loader(p: str) -> RuleSet:
        if threads or threading.current_thread() is not threading.main_thread():
            threads.append(threading.current_thread())
            loading.set()
            release.wait(10)
        return load_rules(p)

    clock = [0.0]
    watcher = RulesWatcher(path, loader=slow_loader, interval=1.0, settle=0.01, clock=lambda: clock[0])
    first = watcher.current
    path.write_text(rules_text("2/s"))
    clock[0] += 1
    started = time.monotonic()
    assert watcher.current is first  # starts the reload, does not wait for it
    assert loading.wait(10)
    assert watcher.current is first  # the load is in flight: the old rules
    assert time.monotonic() - started < 5
    assert threads[0] is not threading.main_thread()
    release.set()
    assert watcher.wait_idle(10)
    assert limits(watcher.current) == {"2/second"}


def rewritten_on_every_wait(monkeypatch: pytest.MonkeyPatch, path: Path, texts: list[str]) -> list[int]:
    """Each settle wait of ``load_settled`` rewrites ``path`` with the next text instead of
    sleeping: a file that changes between every two looks, whatever the machine's load
    does to a writer thread's timing. Returns the count of rewrites."""
    count = [0]

    def sleep(seconds: float) -> None:
        path.write_text(texts[count[0] % len(texts)])
        count[0] += 1

    monkeypatch.setattr(settled, "time", SimpleNamespace(sleep=sleep))
    return count


def test_load_settled_gives_up_on_a_file_that_keeps_changing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(rules_text("1/s"))
    count = rewritten_on_every_wait(monkeypatch, path, [rules_text("2/s"), rules_text("30/s")])
    with pytest.raises(Unsettled) as info:
        load_settled(str(path), load_rules, settle=0.05, rounds=4)
    assert count == [4]
    assert str(info.value).startswith(f"{path}: the file kept changing for 0.2s;")


def test_a_write_during_the_load_is_not_taken_as_what_was_settled(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(rules_text("1/s"))
    calls: list[str] = []

    def loader(p: str) -> RuleSet:
        rules = load_rules(p)
        calls.append(sorted(limits(rules))[0])
        if len(calls) == 1:  # someone writes while this load reads: the load must not count
            path.write_text(rules_text("20/s"))
        return rules

    loaded = load_settled(str(path), loader, settle=0.01, rounds=5)
    assert calls == ["1/second", "20/second"]
    assert loaded.rules is not None and limits(loaded.rules) == {"20/second"}
    assert loaded.signature is not None and loaded.signature[1] == path.stat().st_size


def test_a_forced_reload_of_a_file_that_never_settles_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(rules_text("1/s"))
    events: list[tuple[bool, str | None]] = []
    watcher = RulesWatcher(path, loader=load_rules, settle=0.02, on_reload=lambda ok, e: events.append((ok, e)))
    first = watcher.current
    rewritten_on_every_wait(monkeypatch, path, [rules_text("2/s"), rules_text("30/s")])
    assert watcher.reload() is False
    assert watcher.current is first
    assert len(events) == 1 and events[0][0] is False
    assert f"kept changing for {FORCED_ROUNDS * 0.02:g}s" in str(events[0][1])


async def item(request: Request) -> Response:
    return PlainTextResponse(request.path_params["user"])


def test_the_middleware_never_runs_without_its_rule_while_the_file_is_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(rules_text("1000/s"))
    app = Starlette(routes=[Route("/items/{user}", item)])
    app.add_middleware(RateLimitMiddleware, rules=str(path), reload_interval=0.01)
    policies: list[str] = []
    rewrites = rewriting(path, [rules_text("2000/s"), rules_text("3000/s")], lambda i: 0.5 if i % 10 == 0 else 0.005)
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client, rewrites:
        deadline = time.monotonic() + 3.0
        i = 0
        while time.monotonic() < deadline:
            reply = client.get(f"/items/u{i % 50}")
            assert reply.status_code == 200
            policies.append(reply.headers.get("RateLimit-Policy", ""))
            i += 1
    assert len(policies) > 20
    without = [p for p in policies if '"last"' not in p]
    assert without == [], f"{len(without)} of {len(policies)} requests ran without the rule"
    assert {p.split(";q=")[1].split(";")[0] for p in policies} - {"1000"}  # reloads were taken meanwhile
