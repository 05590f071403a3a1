"""Reloads of the real ``python -m ratekeeper serve``: parsed off the event loop (health
keeps answering while a big file or a YAML bomb is read), never of a half-written file, a
name shared by a native rule and an Envoy rate limit refused, and one result per reload."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from servers import wait_until

from .conftest import Served, start_server

BILLION_LAUGHS = "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)
BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + BILLION_LAUGHS + "rules: *i\n"


def native(uid: str, limit: str = "1000/minute", fillers: int = 12, last: str = "") -> str:
    """``fillers`` rules, then ``{uid}.last`` (or ``last``): cut anywhere before its end,
    the file that still reads has no ``{uid}.last``."""
    text = "rules:\n"
    for i in range(fillers):
        text += f"  - name: {uid}.f{i}\n    match: {{path: /f{i}}}\n    limits: [{limit}]\n"
    return text + f"  - name: {last or uid + '.last'}\n    limits: [{limit}]\n"


def envoy(uid: str, name: str | None = None) -> str:
    named = f", name: {name}" if name else ""
    return f"domain: {uid}-d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 5{named}}}\n"


def reloads(served: Served) -> list[tuple[object, object]]:
    """``(reason, ok)`` of every ``reload`` log line so far."""
    return [(e.get("reason"), e.get("ok")) for e in served.events() if e.get("event") == "reload"]


def reload_metric(served: Served, result: str) -> float:
    text = httpx.get(f"{served.admin_url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ratekeeper_config_reloads_total" and sample.labels == {"result": result}:
                return float(sample.value)
    return 0.0


def rule_names(served: Served) -> list[str]:
    return [r["name"] for r in httpx.get(f"{served.admin_url}/v1/rules", timeout=5).json()["rules"]]


def replace(path: Path, text: str) -> None:
    """Replace the file at once (a rename), as a deployment does."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextmanager
def probing(served: Served) -> Iterator[list[float]]:
    """A thread asking ``/healthz`` and gRPC health in turn until the block ends; yields
    the seconds each answer took (a probe that fails or takes over 5 s fails the test)."""
    stop = threading.Event()
    took: list[float] = []
    failures: list[BaseException] = []

    def loop() -> None:
        with httpx.Client(timeout=5) as client, grpc.insecure_channel(served.grpc_target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not stop.is_set():
                started = time.monotonic()
                try:
                    assert client.get(f"{served.url}/healthz").status_code == 200
                    took.append(time.monotonic() - started)
                    started = time.monotonic()
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                    assert reply.status == health_pb2.HealthCheckResponse.SERVING
                    took.append(time.monotonic() - started)
                except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                    failures.append(exc)
                    return
                stop.wait(0.01)

    thread = threading.Thread(target=loop, name="health-probe", daemon=True)
    thread.start()
    try:
        yield took
    finally:
        stop.set()
        thread.join(10)
    assert failures == []


def test_health_keeps_answering_while_a_big_rules_file_is_parsed(serve: Callable[..., Served], uid: str) -> None:
    served = serve(rules=[native(uid)])
    big = native(uid, fillers=3000)  # ~1.5 s of parsing: long enough to see a stalled loop
    with probing(served) as took:
        wait_until(lambda: len(took) > 10, 10, "the first probes")
        replace(served.rules[0], big)
        wait_until(lambda: ("file changed", True) in reloads(served), 60, "the big file to load")
    during = took[10:]
    assert len(during) > 20 and max(during) < 0.5, f"{len(during)} probes, slowest {max(during):.2f}s"
    assert len(rule_names(served)) == 3001


def test_a_yaml_bomb_swapped_in_is_refused_while_health_answers(serve: Callable[..., Served], uid: str) -> None:
    served = serve(rules=[native(uid)])
    path = served.rules[0]
    with probing(served) as took:
        wait_until(lambda: len(took) > 10, 10, "the first probes")
        replace(path, BILLION_LAUGHS)
        wait_until(lambda: ("file changed", False) in reloads(served), 30, "the refused reload")
    assert max(took) < 1.0
    refused = next(e for e in served.events() if e.get("event") == "reload" and e.get("ok") is False)
    assert f"{path}:6: YAML aliases here repeat more than" in str(refused["error"])
    assert f"{uid}.last" in rule_names(served)
    reply = httpx.post(f"{served.url}/v1/check", json={"rule": f"{uid}.last", "key": "k"}, timeout=5)
    assert reply.status_code == 200


def rewrite_in_place(path: Path, text: str) -> None:
    """Truncate, then write line by line, each line visible at once and the next a moment
    later (a program writing its output into the file), so a reader can catch it half-way."""
    with path.open("w", encoding="utf-8") as f:
        for line in text.splitlines(keepends=True):
            f.write(line)
            f.flush()
            time.sleep(0.0002)


def test_a_rules_file_rewritten_in_place_never_yields_an_unknown_rule(serve: Callable[..., Served], uid: str) -> None:
    served = serve(rules=[native(uid)])
    path = served.rules[0]
    stop = threading.Event()
    versions = [native(uid, "2000/minute"), native(uid, "3000/minute")]
    rewrites = [0]

    def rewriter() -> None:
        while not stop.is_set():
            rewrite_in_place(path, versions[rewrites[0] % 2])
            rewrites[0] += 1
            stop.wait(0.005)

    thread = threading.Thread(target=rewriter, name="rewriter", daemon=True)
    thread.start()
    statuses: list[int] = []
    try:
        with httpx.Client(base_url=served.url, timeout=5) as client:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                reply = client.post("/v1/check", json={"rule": f"{uid}.last", "key": f"k{len(statuses) % 100}"})
                statuses.append(reply.status_code)
                assert reply.status_code == 200, reply.text
    finally:
        stop.set()
        thread.join(10)
    assert rewrites[0] > 100 and len(statuses) > 50
    # Once the file stands still, its last version is taken.
    last = "2000/minute" if rewrites[0] % 2 == 1 else "3000/minute"

    def limits() -> list[str]:
        rules = httpx.get(f"{served.admin_url}/v1/rules", timeout=5).json()["rules"]
        return [limit for r in rules if r["name"] == f"{uid}.last" for limit in r["limits"]]

    wait_until(lambda: limits() == [last], 15, "the settled file to load")
    # A reload may have been refused (a half-written file that looked settled because the
    # writer stalled on a loaded machine fails validation); none was taken half-written:
    # every answer above found the rule.
    assert any(ok for _, ok in reloads(served))


def test_a_native_rule_and_an_envoy_rate_limit_of_one_name_are_refused_at_start(tmp_path: Path, uid: str) -> None:
    # An Envoy rate limit's rule is named by its descriptor path (its YAML name is a label).
    clash = f"{uid}-d.k"
    try:
        start_server(tmp_path, rules=[native(uid, last=clash), envoy(uid, name="any")])
    except RuntimeError as exc:
        message = str(exc)
    else:  # pragma: no cover - the failure the test is about
        raise AssertionError("the service started with two rules of one name")
    assert "exited with 2" in message
    rules_dir = next(tmp_path.glob("serve-*"))
    assert f"{rules_dir / 'rules1.yaml'}:3: the rate limit {clash!r} has the name of the rule at " in message
    assert f"{rules_dir / 'rules0.yaml'}:" in message


def test_a_name_clash_at_reload_is_refused_and_the_old_rules_stay(serve: Callable[..., Served], uid: str) -> None:
    served = serve(rules=[native(uid), envoy(uid)])
    before = rule_names(served)
    replace(served.rules[0], native(uid, last=f"{uid}-d.k"))  # the Envoy limit's descriptor path
    wait_until(lambda: ("file changed", False) in reloads(served), 15, "the refused reload")
    refused = next(e for e in served.events() if e.get("event") == "reload" and e.get("ok") is False)
    assert f"{served.rules[1]}:3: the rate limit '{uid}-d.k' has the name of the rule at {served.rules[0]}:" in str(
        refused["error"]
    )
    assert rule_names(served) == before
    assert reload_metric(served, "failed") == 1 and reload_metric(served, "ok") == 0


def test_sighup_with_one_broken_file_gives_one_reload_one_result(serve: Callable[..., Served], uid: str) -> None:
    served = serve(rules=[native(uid), envoy(uid)])
    good = served.rules[1]
    text = good.read_text()
    broken = text.replace("unit: second", "unit: sec0nd")
    # Same size, same inode, same mtime: the ticker sees no change, only SIGHUP reads it again.
    st = good.stat()
    with good.open("r+", encoding="utf-8") as f:
        f.write(broken)
    os.utime(good, ns=(st.st_atime_ns, st.st_mtime_ns))
    served.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: reloads(served), 15, "the SIGHUP reload")
    replace(good, text)  # repaired: the next look takes it
    wait_until(lambda: len(reloads(served)) >= 2, 15, "the repaired file to load")
    assert reloads(served) == [("SIGHUP", False), ("file changed", True)]
    refused = next(e for e in served.events() if e.get("event") == "reload")
    assert f"{good}:4: unknown unit 'sec0nd'" in str(refused["error"])
    assert reload_metric(served, "failed") == 1 and reload_metric(served, "ok") == 1
