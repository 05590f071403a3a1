"""The two HTTP surfaces of ``ratekeeper serve``: the decision surface answers decisions
and health only, the admin surface holds reset, refund, rules, metrics and (only with
--store-api) the store API; each listener can be turned off; every reset and refund is
logged with who asked; a listener beyond loopback without a token or TLS is warned about."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from servers import wait_until

from .conftest import ROOT, Served


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its sockets in state LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def start_event(served: Served) -> dict[str, object]:
    """The ``start`` log line (the listeners may answer a moment before it is written; the
    warnings about the listeners come before it)."""
    wait_until(lambda: any(e.get("event") == "start" for e in served.events()), 10, "the start log line")
    return next(e for e in served.events() if e.get("event") == "start")


ADMIN_ROUTES = [("POST", "/v1/reset"), ("POST", "/v1/refund"), ("GET", "/v1/rules"), ("GET", "/metrics")]


def test_admin_routes_are_not_on_the_decision_port_and_decisions_are_not_on_the_admin_port(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    body = {"rule": "items.list", "key": "alice"}
    for method, path in [*ADMIN_ROUTES, ("POST", "/v1/store")]:
        reply = httpx.request(method, f"{served.url}{path}", json=body if method == "POST" else None, timeout=5)
        assert 404 == reply.status_code, path
        assert "decision surface" in reply.json()["detail"]
    for method, path in ADMIN_ROUTES:
        reply = httpx.request(method, f"{served.admin_url}{path}", json=body if method == "POST" else None, timeout=5)
        assert 200 == reply.status_code, (path, reply.text)
    for path in ("/v1/check", "/v1/peek", "/json"):
        assert 404 == httpx.post(f"{served.admin_url}{path}", json=body, timeout=5).status_code, path
    assert 200 == httpx.post(f"{served.url}/v1/check", json=body, timeout=5).status_code
    assert 200 == httpx.get(f"{served.admin_url}/healthz", timeout=5).status_code
    # without --store-api the store API is nowhere
    assert 404 == httpx.post(f"{served.admin_url}/v1/store", json={}, timeout=5).status_code
    assert {served.http_port, served.grpc_port, served.admin_port} == listening_ports(served.proc.pid)
    event = start_event(served)
    assert (served.url, served.admin_url) == (event["http"], event["admin"])


def test_the_store_api_is_on_the_admin_surface_only_when_asked(serve: Callable[..., Served]) -> None:
    by_option = serve(args=["--store-api"])
    by_env = serve(env={"RATEKEEPER_STORE_API": "1"})
    for served in (by_option, by_env):
        reply = httpx.post(f"{served.admin_url}/v1/store", json={"ops": []}, timeout=5)
        assert 400 == reply.status_code  # routed: B's validation answers, not "no route"
        assert "no route" not in reply.json()["detail"]
        assert 404 == httpx.post(f"{served.url}/v1/store", json={"ops": []}, timeout=5).status_code
        assert "/v1/store" in httpx.get(f"{served.admin_url}/openapi.json", timeout=5).json()["paths"]


def test_admin_port_off_really_has_no_listener(serve: Callable[..., Served]) -> None:
    served = serve(admin=False)
    assert {served.http_port, served.grpc_port} == listening_ports(served.proc.pid)
    assert start_event(served)["admin"] is None
    assert 200 == httpx.post(f"{served.url}/v1/check", json={"rule": "items.list", "key": "a"}, timeout=5).status_code


def test_admin_port_from_the_environment_and_the_decision_port_off(serve: Callable[..., Served]) -> None:
    served = serve(ports_from_env=True, env={"RATEKEEPER_HTTP_PORT": "off"}, ready=lambda s: _ok(s.admin_url))
    assert {served.grpc_port, served.admin_port} == listening_ports(served.proc.pid)
    assert start_event(served)["http"] is None


def _ok(url: str) -> bool:
    return httpx.get(f"{url}/healthz", timeout=1).status_code == 200


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--http-port", "off", "--grpc-port", "off", "--admin-port", "off"], "every listener is off"),
        (["--admin-port", "off", "--store-api"], "--store-api"),
        (["--admin-port", "of"], "--admin-port must be a port number or 'off'"),
        (["--read-timeout", "0"], "--read-timeout must be greater than 0"),
        (["--tls-cert", "x.pem"], "--tls-cert and --tls-key go together"),
    ],
    ids=["all-off", "store-api-without-admin", "bad-port", "bad-timeout", "cert-without-key"],
)
def test_a_setting_that_cannot_work_stops_the_start_with_a_clear_error(
    args: list[str], says: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATEKEEPER_")}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ratekeeper",
            "serve",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--admin-port",
            "0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT / "src")},
        check=False,
    )
    assert 2 == out.returncode, out.stderr
    assert says in out.stderr


def test_every_reset_and_refund_is_logged_with_who_asked(serve: Callable[..., Served], uid: str) -> None:
    rules = f'rules:\n  - name: {uid}.r\n    limits: ["5/minute"]\n'
    served = serve(rules=[rules])
    with httpx.Client(base_url=served.admin_url, timeout=5) as admin:
        assert 200 == admin.post("/v1/refund", json={"rule": f"{uid}.r", "key": "k1", "cost": 2}).status_code
        assert 200 == admin.post("/v1/reset", json={"rule": f"{uid}.r", "key": "k2"}).status_code
        assert 400 == admin.post("/v1/reset", json={"rule": "nope", "key": "k3"}).status_code
    audit = [e for e in served.events() if e.get("event") in ("reset", "refund")]
    assert [("refund", f"{uid}.r", "k1"), ("reset", f"{uid}.r", "k2")] == [
        (e["event"], e["rule"], e["key"]) for e in audit
    ]
    for e in audit:
        assert e["ok"] is True and e["token"] is None
        host, port = str(e["peer"]).rsplit(":", 1)
        assert "127.0.0.1" == host and port.isdigit()
    assert 2 == audit[0]["cost"]


def test_a_listener_beyond_loopback_without_token_or_tls_is_warned_about(
    serve: Callable[..., Served], tmp_path: Path
) -> None:
    tokens = tmp_path / "admin.tokens"
    tokens.write_text("ops:0123456789abcdef0123\n")
    open_admin = serve(args=["--admin-host", "0.0.0.0"])
    start_event(open_admin)
    warned = [e for e in open_admin.events() if e.get("event") == "exposed"]
    assert [("warning", "admin")] == [(e["level"], e["surface"]) for e in warned]
    guarded = serve(args=["--admin-host", "0.0.0.0", "--admin-token-file", str(tokens)])
    start_event(guarded)
    assert [] == [e for e in guarded.events() if e.get("event") == "exposed"]
    on_loopback = serve()
    start_event(on_loopback)
    assert [] == [e for e in on_loopback.events() if e.get("event") == "exposed"]
