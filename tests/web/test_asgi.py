"""The ASGI middleware under a real uvicorn server, seen by a real HTTP client (httpx).

Header fields are parsed with ``http_sf`` (an independent implementation of RFC 8941),
never with ratekeeper's own code.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import Any

import http_sf
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from ratekeeper.web import RateLimitMiddleware
from ratekeeper.web.problem import QUOTA_EXCEEDED, QUOTA_EXCEEDED_TITLE

from .conftest import http_rule
from .uvicorn_server import serve


async def item(request: Request) -> Response:
    return JSONResponse({"user": request.path_params["user"]})


def make_app(rules: list[Any], **options: Any) -> Starlette:
    app = Starlette(routes=[Route("/items/{user}", item)])
    app.add_middleware(RateLimitMiddleware, rules=rules, **options)
    return app


async def fire(url: str, n: int, **kwargs: Any) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=10) as client:
        return list(await asyncio.gather(*(client.get(url, **kwargs) for _ in range(n))))


def policy(response: httpx.Response) -> dict[str, dict[str, Any]]:
    """``RateLimit-Policy`` parsed by http_sf: policy name -> parameters."""
    parsed = http_sf.parse(response.headers["RateLimit-Policy"].encode(), tltype="list")
    return {name: dict(params) for name, params in parsed}  # type: ignore[misc]


def state(response: httpx.Response) -> dict[str, dict[str, Any]]:
    parsed = http_sf.parse(response.headers["RateLimit"].encode(), tltype="list")
    return {name: dict(params) for name, params in parsed}  # type: ignore[misc]


def test_partner_scenario_one_200_and_nine_429_with_every_field(store_url: str, rule_name: str) -> None:
    """1/3s per partner on GET /items/{user}, 10 concurrent calls: one passes, nine get a
    429 carrying every field docs/web.md lists ("What a client sees"), on each store."""
    rule = http_rule(rule_name, "1/3s", path="/items/{user}", methods=("GET",), key="{path.user}")
    with serve(make_app([rule], store=store_url)) as base:
        responses = asyncio.run(fire(f"{base}/items/acme", 10))
    statuses = sorted(r.status_code for r in responses)
    assert [200] + [429] * 9 == statuses
    for r in responses:
        assert {rule_name: {"q": 1, "w": 3}} == policy(r)
        limit_state = state(r)[rule_name]
        assert 0 == limit_state["r"]
        assert 1 <= limit_state["t"] <= 3
        assert "1" == r.headers["X-RateLimit-Limit"]
        assert "0" == r.headers["X-RateLimit-Remaining"]
        assert 1 <= int(r.headers["X-RateLimit-Reset"]) <= 3
    ok = next(r for r in responses if r.status_code == 200)
    assert {"user": "acme"} == ok.json()
    assert "Retry-After" not in ok.headers
    for r in (r for r in responses if r.status_code == 429):
        assert "application/problem+json" == r.headers["Content-Type"]
        body = json.loads(r.content)
        retry = int(r.headers["Retry-After"])
        assert 1 <= retry <= 3
        assert {
            "type": QUOTA_EXCEEDED,
            "title": QUOTA_EXCEEDED_TITLE,
            "status": 429,
            "violated-policies": [rule_name],
            "rule": rule_name,
            "limit": "1/3s",
            "retry_after": retry,
        } == {k: v for k, v in body.items() if k != "detail"}
        assert rule_name in body["detail"]
        assert retry == int(r.headers["X-RateLimit-Reset"])


def test_another_partner_is_not_limited_by_the_first(rule_name: str) -> None:
    rule = http_rule(rule_name, "1/3s", path="/items/{user}", key="{path.user}")
    with serve(make_app([rule])) as base:
        first = asyncio.run(fire(f"{base}/items/a", 2))
        other = asyncio.run(fire(f"{base}/items/b", 1))
    assert [200, 429] == sorted(r.status_code for r in first)
    assert [200] == [r.status_code for r in other]


class Recorder:
    """A metrics object that keeps what it is told (the limiter's observer and the web's calls)."""

    def __init__(self) -> None:
        self.decisions: list[Any] = []
        self.skips: list[str] = []
        self.shadow: list[list[str]] = []
        self.reloads: list[bool] = []

    def decided(self, decision: Any) -> None:
        self.decisions.append(decision)

    def store_call(self, seconds: float, error: Any) -> None:
        pass

    def breaker_changed(self, old: str, new: str) -> None:
        pass

    def shadow_rules(self, names: Any) -> None:
        self.shadow.append(list(names))

    def skipped(self, rule: str) -> None:
        self.skips.append(rule)

    def reloaded(self, ok: bool) -> None:
        self.reloads.append(ok)

    def request(self, transport: str) -> None:
        pass


def get_all(base: str, paths: list[str], headers_each: list[dict[str, str]] | None = None) -> list[httpx.Response]:
    """Sequential requests, in order."""
    with httpx.Client(base_url=base, timeout=10) as client:
        return [client.get(p, headers=(headers_each or [{}] * len(paths))[i]) for i, p in enumerate(paths)]


def test_a_spoofed_forwarded_for_is_ignored_behind_a_trusted_proxy(rule_name: str) -> None:
    """Behind trusted proxies (two hops here), the client is the address the outer proxy
    appended: what the client wrote itself (left of it) changes nothing, and only the
    configured header is read."""
    rule = http_rule(rule_name, "1/minute", key="{client_ip}")
    with serve(make_app([rule], trusted_proxies=["127.0.0.1", "10.0.0.0/8"], trusted_hops=2)) as base:
        got = get_all(
            base,
            ["/items/x"] * 5,
            [
                {"X-Forwarded-For": "1.1.1.1, 203.0.113.9"},
                {"X-Forwarded-For": "2.2.2.2, 203.0.113.9"},  # same client, another spoof: refused
                {"X-Forwarded-For": "203.0.113.9, 10.0.0.2"},  # through a second trusted proxy: same client
                {"X-Forwarded-For": "203.0.113.10"},  # another client
                {"Forwarded": "for=203.0.113.11"},  # not the configured header: the peer, 127.0.0.1
            ],
        )
    assert [200, 429, 429, 200, 200] == [r.status_code for r in got]
    forwarded = http_rule(rule_name + ".f", "1/minute", key="{client_ip}")
    with serve(make_app([forwarded], trusted_proxies=["127.0.0.1"], forwarded_header="forwarded")) as base:
        got = get_all(
            base,
            ["/items/x"] * 3,
            [
                {"Forwarded": 'for=6.6.6.6, for="203.0.113.10:4711";proto=https'},
                {"Forwarded": 'for=7.7.7.7, for="203.0.113.10"'},  # RFC 7239: same client
                {"X-Forwarded-For": "203.0.113.12"},  # not the configured header: the peer
            ],
        )
    assert [200, 429, 200] == [r.status_code for r in got]


def test_forwarded_headers_from_an_untrusted_peer_are_ignored(rule_name: str) -> None:
    rule = http_rule(rule_name, "1/minute", key="{client_ip}")
    with serve(make_app([rule], trusted_proxies=["10.0.0.0/8"])) as base:
        got = get_all(base, ["/items/x"] * 2, [{"X-Forwarded-For": "1.1.1.1"}, {"X-Forwarded-For": "2.2.2.2"}])
    assert [200, 429] == [r.status_code for r in got]


def test_ipv6_clients_of_one_64_share_a_key_unless_configured(rule_name: str) -> None:
    rule = http_rule(rule_name, "1/minute", key="{client_ip}")
    same_64 = [{"X-Forwarded-For": "2001:db8:1:2::1"}, {"X-Forwarded-For": "2001:db8:1:2:ffff::9"}]
    with serve(make_app([rule], trusted_proxies=["127.0.0.1"])) as base:
        grouped = get_all(base, ["/items/x"] * 2, same_64)
    with serve(
        make_app(
            [http_rule(rule_name + "b", "1/minute", key="{client_ip}")], trusted_proxies=["127.0.0.1"], ipv6_prefix=128
        )
    ) as base:
        single = get_all(base, ["/items/x"] * 2, same_64)
    assert [200, 429] == [r.status_code for r in grouped]
    assert [200, 200] == [r.status_code for r in single]


def test_a_rule_whose_header_is_missing_is_skipped_and_counted(rule_name: str) -> None:
    rule = http_rule(rule_name, "1/minute", key="{header.x-api-key}")
    metrics = Recorder()
    with serve(make_app([rule], metrics=metrics)) as base:
        without = get_all(base, ["/items/x"] * 3)
        with_key = get_all(base, ["/items/x"] * 2, [{"X-Api-Key": "k1"}] * 2)
    assert [200, 200, 200] == [r.status_code for r in without]
    assert all("RateLimit" not in r.headers for r in without)
    assert [rule_name] * 3 == metrics.skips
    assert [200, 429] == [r.status_code for r in with_key]


def test_shadow_rules_never_refuse_and_send_no_headers(rule_name: str) -> None:
    shadow = http_rule(rule_name, "1/minute", shadow=True)
    metrics = Recorder()
    with serve(make_app([shadow], metrics=metrics)) as base:
        got = get_all(base, ["/items/x"] * 4)
    assert [200] * 4 == [r.status_code for r in got]
    assert all("RateLimit-Policy" not in r.headers and "X-RateLimit-Limit" not in r.headers for r in got)
    assert [True, False, False, False] == [d.allowed for d in metrics.decisions]  # decided and counted
    assert [[rule_name]] == metrics.shadow


def test_shadow_true_makes_every_rule_a_shadow_and_enforced_ones_still_refuse(rule_name: str) -> None:
    enforced = http_rule(rule_name, "2/minute")
    dry_run = http_rule(rule_name + ".new", "1/minute")
    with serve(make_app([enforced, dry_run], shadow=[rule_name + ".new"])) as base:
        got = get_all(base, ["/items/x"] * 3)
    with serve(make_app([http_rule(rule_name + ".all", "1/minute")], shadow=True)) as base:
        everything = get_all(base, ["/items/x"] * 3)
    assert [200, 200, 429] == [r.status_code for r in got]
    assert {rule_name} == set(policy(got[0]))  # the shadow rule is not advertised
    assert [200, 200, 200] == [r.status_code for r in everything]


async def flaky(request: Request) -> Response:
    return PlainTextResponse("upstream failed", status_code=int(request.path_params["status"]))


def status_app(rules: list[Any], **options: Any) -> Starlette:
    app = Starlette(routes=[Route("/status/{status}", flaky), Route("/items/{user}", item)])
    app.add_middleware(RateLimitMiddleware, rules=rules, **options)
    return app


def test_a_5xx_gives_the_cost_back_and_still_carries_the_headers(rule_name: str) -> None:
    rule = http_rule(rule_name, "1/minute")
    with serve(status_app([rule], refund_statuses=range(500, 600))) as base:
        failed = get_all(base, ["/status/503"] * 3)
        after = get_all(base, ["/status/200", "/status/200"])
    assert [503, 503, 503] == [r.status_code for r in failed]
    assert all({rule_name: {"q": 1, "w": 60}} == policy(r) for r in failed)  # headers on app errors too
    assert [200, 429] == [r.status_code for r in after]


def test_without_refund_statuses_a_5xx_is_charged(rule_name: str) -> None:
    rule = http_rule(rule_name, "1/minute")
    with serve(status_app([rule])) as base:
        got = get_all(base, ["/status/500", "/status/200"])
    assert [500, 429] == [r.status_code for r in got]


def test_exemptions_skip_limiting_entirely(rule_name: str) -> None:
    rule = http_rule(rule_name, "1/minute", key="{header.x-api-key}")
    options: dict[str, Any] = {
        "exempt_paths": ["/status/*"],
        "exempt_keys": {rule_name: ["admin"]},
        "exempt": lambda view: view.header("x-internal") == "yes",
    }
    with serve(status_app([rule], **options)) as base:
        paths = get_all(base, ["/status/200"] * 3, [{"X-Api-Key": "u"}] * 3)
        admin = get_all(base, ["/items/a"] * 3, [{"X-Api-Key": "admin"}] * 3)
        internal = get_all(base, ["/items/a"] * 3, [{"X-Api-Key": "u", "X-Internal": "yes"}] * 3)
        user = get_all(base, ["/items/a"] * 2, [{"X-Api-Key": "u"}] * 2)
    assert [200] * 9 == [r.status_code for r in paths + admin + internal]
    assert all("RateLimit" not in r.headers for r in admin)
    assert [200, 429] == [r.status_code for r in user]
    with serve(status_app([rule], exempt_networks=["127.0.0.0/8"], exempt_methods=["HEAD"])) as base:
        local = get_all(base, ["/items/a"] * 3, [{"X-Api-Key": "u2"}] * 3)
    assert [200] * 3 == [r.status_code for r in local]


def test_costs_from_a_template_and_a_callable(rule_name: str) -> None:
    weighted = http_rule(rule_name, "10/minute", key="{path.user}", path="/items/{user}", cost="{header.x-cost}")
    with serve(make_app([weighted])) as base:
        got = get_all(base, ["/items/a"] * 3, [{"X-Cost": "6"}, {"X-Cost": "5"}, {"X-Cost": "4"}])
    assert [200, 429, 200] == [r.status_code for r in got]
    assert 0 == state(got[2])[rule_name]["r"]
    by_callable = http_rule(rule_name + ".c", "10/minute")
    with serve(make_app([by_callable], cost=lambda view, rule: 4)) as base:
        got = get_all(base, ["/items/a"] * 3)
    assert [200, 200, 429] == [r.status_code for r in got]


def test_header_families_switch_off_and_the_denial_can_be_replaced(rule_name: str) -> None:
    rule = http_rule(rule_name, "1/minute")

    def teapot(denied: Any) -> tuple[int, list[tuple[str, str]], str]:
        return 418, [("Content-Type", "text/plain")], f"slow down, {denied[0].rule}"

    with serve(make_app([rule], ratelimit_headers=False, deny_response=teapot)) as base:
        got = get_all(base, ["/items/a"] * 2)
    assert [200, 418] == [r.status_code for r in got]
    assert f"slow down, {rule_name}" == got[1].text
    assert "RateLimit" not in got[1].headers and "RateLimit-Policy" not in got[1].headers
    assert "1" == got[1].headers["X-RateLimit-Limit"]
    with serve(make_app([http_rule(rule_name + ".x", "1/minute")], x_ratelimit_headers=False)) as base:
        got = get_all(base, ["/items/a"] * 2)
    assert "X-RateLimit-Limit" not in got[1].headers and "RateLimit" in got[1].headers
    assert "Retry-After" in got[1].headers


def test_a_streaming_response_streams_through(rule_name: str) -> None:
    """The first chunk reaches the client while the app still waits for the client's go:
    the middleware buffers nothing."""
    import threading

    go = threading.Event()
    waited: list[bool] = []

    async def chunks() -> Any:
        yield b"first;"
        waited.append(await asyncio.to_thread(go.wait, 10))
        yield b"second"

    async def stream(request: Request) -> Response:
        return StreamingResponse(chunks(), media_type="text/plain")

    app = Starlette(routes=[Route("/stream", stream)])
    app.add_middleware(RateLimitMiddleware, rules=[http_rule(rule_name, "5/minute")])
    with serve(app) as base, httpx.Client(timeout=15) as client, client.stream("GET", f"{base}/stream") as r:
        raw = r.iter_raw()
        first = next(raw)
        go.set()
        rest = b"".join(raw)
        headers = r.headers
    assert b"first;" == first
    assert b"second" == rest
    assert [True] == waited
    assert {rule_name: {"q": 5, "w": 60}} == policy_of(headers)


def policy_of(headers: httpx.Headers) -> dict[str, dict[str, Any]]:
    parsed = http_sf.parse(headers["RateLimit-Policy"].encode(), tltype="list")
    return {name: dict(params) for name, params in parsed}  # type: ignore[misc]


def test_websockets_pass_through_uncounted(rule_name: str) -> None:
    from websockets.sync.client import connect

    async def echo(ws: WebSocket) -> None:
        await ws.accept()
        await ws.send_text(await ws.receive_text())
        await ws.close()

    app = Starlette(routes=[WebSocketRoute("/ws", echo), Route("/items/{user}", item)])
    app.add_middleware(RateLimitMiddleware, rules=[http_rule(rule_name, "1/minute")])
    with serve(app) as base:
        echoed = []
        for i in range(3):
            with connect(base.replace("http", "ws") + "/ws", open_timeout=10) as ws:
                ws.send(f"hello {i}")
                echoed.append(ws.recv(timeout=10))
        got = get_all(base, ["/items/a"] * 2)
    assert ["hello 0", "hello 1", "hello 2"] == echoed
    assert [200, 429] == [r.status_code for r in got]


def test_route_and_path_params_come_from_the_app_when_the_rule_has_no_path(rule_name: str) -> None:
    per_route = http_rule(rule_name, "1/minute", key="{route}:{path.user}")
    with serve(make_app([per_route])) as base:
        got = get_all(base, ["/items/a", "/items/a", "/items/b", "/nowhere"])
    assert [200, 429, 200, 404] == [r.status_code for r in got]


def write_atomically(path: Any, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


RULES_FILE = """\
rules:
  - name: {name}
    match: {{methods: [GET], path: "/items/{{user}}"}}
    key: "{{path.user}}"
    limits: ["{limit}"]
"""


def wait_for(condition: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_reload_under_load_fails_no_request_and_a_bad_file_keeps_the_rules(tmp_path: Any, rule_name: str) -> None:
    """The rules file changes while requests flow: none fails, the new limit applies once
    loaded; a file that fails validation is refused and the last good rules stay."""
    path = tmp_path / "rules.yaml"
    path.write_text(RULES_FILE.format(name=rule_name, limit="1/minute"))
    metrics = Recorder()
    stop = threading.Event()
    seen: list[int | str] = []

    def load(base: str) -> None:
        with httpx.Client(base_url=base, timeout=10) as client:
            i = 0
            while not stop.is_set():
                try:
                    seen.append(client.get(f"/items/load{i % 5}").status_code)
                except httpx.HTTPError as exc:
                    seen.append(repr(exc))
                i += 1

    with serve(make_app(str(path), metrics=metrics, reload_interval=0.02)) as base:
        before = get_all(base, ["/items/a", "/items/a"])
        workers = [threading.Thread(target=load, args=(base,)) for _ in range(3)]
        for w in workers:
            w.start()
        try:
            wait_for(lambda: len(seen) > 30, "load before the change")
            write_atomically(path, RULES_FILE.format(name=rule_name, limit="1000/minute"))
            wait_for(lambda: metrics.reloads == [True], "the reload")
            reloaded = get_all(base, ["/items/b"] * 3)
            path.write_text(RULES_FILE.format(name=rule_name, limit="not a limit"))
            wait_for(lambda: metrics.reloads == [True, False], "the refusal of the bad file")
            kept = get_all(base, ["/items/c"] * 3)
            count = len(seen)
            wait_for(lambda: len(seen) > count + 30, "load after the refusal")
        finally:
            stop.set()
            for w in workers:
                w.join(10)
    assert [200, 429] == [r.status_code for r in before]
    assert [200, 200, 200] == [r.status_code for r in reloaded]
    assert [200, 200, 200] == [r.status_code for r in kept]
    assert set(seen) <= {200, 429}, [s for s in seen if s not in (200, 429)]
    assert {1000} == {policy(r)[rule_name]["q"] for r in kept}


def test_the_middleware_exports_the_metrics_of_its_decisions(rule_name: str) -> None:
    """With a real ``Metrics``: decisions per rule by outcome, shadow refusals, skipped rules, requests."""
    from ratekeeper.metrics import Metrics

    metrics = Metrics()
    rules = [
        http_rule(rule_name, "1/minute"),
        http_rule(rule_name + ".dry", "1/minute", shadow=True),
        http_rule(rule_name + ".key", "1/minute", key="{header.x-key}"),
    ]
    with serve(make_app(rules, metrics=metrics)) as base:
        got = get_all(base, ["/items/a"] * 3)
    assert [200, 429, 429] == [r.status_code for r in got]

    def value(name: str, **labels: str) -> float | None:
        return metrics.value(name, **labels)

    assert 1 == value("ratekeeper_decisions_total", rule=rule_name, outcome="near")  # 1 of 1 used
    assert 2 == value("ratekeeper_decisions_total", rule=rule_name, outcome="over")
    assert 1 == value("ratekeeper_decisions_total", rule=rule_name + ".dry", outcome="near")
    # the two refused requests charge nothing, the shadow rule included (only peeked)
    assert None is value("ratekeeper_decisions_total", rule=rule_name + ".dry", outcome="shadow_over")
    assert 3 == value("ratekeeper_skipped_total", rule=rule_name + ".key")
    assert 3 == value("ratekeeper_requests_total", transport="asgi")


def test_an_app_that_raises_counts_as_a_500_for_refunds(rule_name: str) -> None:
    async def boom(request: Request) -> Response:
        raise RuntimeError("bug")

    app = Starlette(routes=[Route("/boom", boom), Route("/items/{user}", item)])
    app.add_middleware(RateLimitMiddleware, rules=[http_rule(rule_name, "1/minute")], refund_statuses={500})
    with serve(app) as base:
        crashed = [
            httpx.get(f"{base}/boom", timeout=10) for _ in range(2)
        ]  # uvicorn drops the connection after a crash
        after = get_all(base, ["/items/a", "/items/a"])
    assert [500, 500] == [r.status_code for r in crashed]  # refunded: never a 429
    assert [200, 429] == [r.status_code for r in after]
