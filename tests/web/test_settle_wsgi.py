"""``response_cost`` under WSGI: the middleware around a generator body served by wsgiref
(a client that goes away mid-stream is charged what was streamed), and the Flask
extension under werkzeug's server (a streamed response settled when it is closed, a cost
header that puts the key in debt)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx
import pytest
from flask import Flask, Response, request, stream_with_context
from werkzeug.serving import make_server as werkzeug_server

from ratekeeper import Rule
from ratekeeper.config.model import HttpRule, KeyTemplate
from ratekeeper.limiter.limiter import Limiter
from ratekeeper.stores.url import open_store
from ratekeeper.testing import FakeClock
from ratekeeper.web import Usage, WSGIRateLimitMiddleware, usage
from ratekeeper.web.flask import RateLimiter

from .watched import WatchedLimiter as Watched
from .wsgiref_server import serving, wsgiref

PEER = "127.0.0.1"
WAIT = 10.0


def rule(name: str, limits: str = "1000/day", algorithm: str = "fixed_window") -> HttpRule:
    return HttpRule(Rule(name, limits, algorithm), key=KeyTemplate.parse("{client_ip}"))


def used(limiter: Limiter, r: HttpRule, count: int = 1000) -> int:
    return count - limiter.peek(r.rule, PEER).remaining - 1


CHUNK = 1000


def generator_app(meters: list[Usage], go: threading.Event, parts: int) -> Callable[..., Iterable[bytes]]:
    """A WSGI app streaming ``parts`` chunks, each added to the meter once the server
    took it; after two it waits for ``go``."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        meter = usage(environ)
        meters.append(meter)
        start_response("200 OK", [("Content-Type", "application/octet-stream")])

        def body() -> Iterator[bytes]:
            for i in range(parts):
                if i == 2:
                    go.wait(WAIT)
                yield b"x" * CHUNK
                meter.add(1)

        return body()

    return app


def test_a_generator_body_is_settled_at_close_also_when_the_client_cuts_it(rule_name: str) -> None:
    r = rule(rule_name, "100000/day")
    store = open_store("memory://", clock=FakeClock())
    limiter = Watched(store)
    meters: list[Usage] = []
    go = threading.Event()
    parts = 5000  # far more than the socket buffers hold: a write fails once the client is gone
    app = WSGIRateLimitMiddleware(generator_app(meters, go, parts), rules=[r], limiter=limiter, response_cost="x-cost")
    with serving(wsgiref(app)) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
            sock.sendall(b"GET /stream HTTP/1.0\r\nHost: test\r\n\r\n")
            received = b""
            while received.count(b"x") < 2 * CHUNK:
                data = sock.recv(65536)
                assert data, "the server closed before two chunks"
                received += data
        go.set()  # the app streams on, into a closed connection
        limiter.wait()
        total = meters[0].total
        assert 2 <= total < parts  # cut: not every chunk
        assert used(limiter, r, 100000) == total

        # a whole response: settled with all of it
        go.set()
        response = httpx.get(f"{url}/stream", timeout=WAIT)
        assert len(response.content) == parts * CHUNK
        limiter.wait()
        assert used(limiter, r, 100000) == total + parts


def test_a_cost_header_of_a_wsgi_app_charges_or_refunds(rule_name: str) -> None:
    r = rule(rule_name, "5/minute", "gcra")
    clock = FakeClock()
    limiter = Watched(open_store("memory://", clock=clock))

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        start_response("200 OK", [("X-Cost", environ.get("QUERY_STRING", ""))])
        return [b"ok"]

    wrapped = WSGIRateLimitMiddleware(app, rules=[r], limiter=limiter, response_cost="x-cost")
    with serving(wsgiref(wrapped)) as url, httpx.Client(timeout=WAIT) as client:
        for _ in range(8):  # more than the limit, each refunded
            assert client.get(f"{url}/?0").status_code == 200
            limiter.wait()
        assert client.get(f"{url}/?20").status_code == 200
        limiter.wait()
        refused = client.get(f"{url}/?1")
        assert refused.status_code == 429
        clock.advance(int(refused.headers["retry-after"]))
        assert client.get(f"{url}/?1").status_code == 200


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_flask_settles_a_streamed_response_when_it_is_closed(kind: str, rule_name: str, key_prefix: str) -> None:
    r = rule(rule_name)
    if kind == "memory":
        limiter = Watched(open_store("memory://", clock=FakeClock()))
    else:
        limiter = Watched(f"redis://127.0.0.1:6379/0?prefix={key_prefix}")
    app = Flask(__name__)
    app.config["RATEKEEPER_RULES"] = [r]
    app.config["RATEKEEPER_OPTIONS"] = {"response_cost": "x-rows", "limiter": limiter}
    RateLimiter(app, store=None)

    @app.get("/export")
    def export() -> Response:
        meter = usage(request)

        def rows() -> Iterator[str]:
            for i in range(7):
                meter.add(3)
                yield f"row {i}\n"

        return Response(stream_with_context(rows()), mimetype="text/plain")

    @app.get("/rows")
    def rows() -> Response:
        return Response("ok", headers={"X-Rows": request.args.get("n", "")})

    server = werkzeug_server("127.0.0.1", 0, app, threaded=True)
    with serving(server) as url, httpx.Client(timeout=WAIT) as client:
        response = client.get(f"{url}/export")
        assert response.status_code == 200 and response.text.count("row") == 7
        limiter.wait()
        assert used(limiter, r) == 21
        assert client.get(f"{url}/rows", params={"n": "0"}).status_code == 200
        limiter.wait()
        assert used(limiter, r) == 21
        assert client.get(f"{url}/rows", params={"n": "-4"}).status_code == 200  # hostile: the charge stays
        # a settlement waited for, of an amount of its own: the hostile one settled nothing by then
        assert client.get(f"{url}/rows", params={"n": "5"}).status_code == 200
        limiter.wait()
        assert used(limiter, r) == 27  # 21, the hostile one's 1, then 5
