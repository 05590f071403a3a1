"""The Flask app the WSGI tests serve with gunicorn: ``web.wsgi.flask_app:app``.

Routes: ``/health`` (no rule matches it), ``/items/<user>`` (JSON), ``/fail/<code>``
(answers that status), ``/boom`` (raises: Flask turns it into a 500), ``/stream/<n>``
(a streamed body of n chunks), ``/exempt/...``. Outside the rate limiter a last WSGI
layer adds ``X-Worker: <pid>`` to every response, so a test can tell which gunicorn
worker decided.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from flask import Flask, Response, jsonify, request

from ratekeeper.web import WSGIRateLimitMiddleware
from web.wsgi import config

app = Flask(__name__)


@app.get("/health")
def health() -> str:
    return "ok"


@app.get("/items/<user>")
def items(user: str) -> Any:
    return jsonify(user=user, pid=os.getpid())


@app.get("/fail/<int:code>")
def fail(code: int) -> Any:
    return Response("failed", status=code)


@app.get("/boom")
def boom() -> Any:
    raise RuntimeError("the app failed")


class Chunks:
    """A streamed body that counts how often the server closed it (``/closed`` tells)."""

    closed = 0

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[bytes]:
        for i in range(self.n):
            yield f"chunk {i}\n".encode()

    def close(self) -> None:
        Chunks.closed += 1


@app.get("/stream/<int:n>")
def stream(n: int) -> Any:
    return Response(Chunks(n), mimetype="text/plain")


@app.get("/closed")
def closed() -> Any:
    return jsonify(closed=Chunks.closed)


@app.get("/exempt/<path:rest>")
def exempt(rest: str) -> Any:
    return jsonify(rest=rest)


@app.get("/r/<x>")
def route(x: str) -> Any:
    return jsonify(x=x)


@app.get("/ip")
def ip() -> Any:
    return jsonify(peer=request.remote_addr)


@app.get("/metrics")
def metrics() -> Any:
    body, content_type = config.metrics().exposition()
    return Response(body, content_type=content_type)


@app.get("/header")
def header() -> Any:
    return jsonify(key=request.headers.get("X-Api-Key"))


def _with_worker_pid(inner: Any) -> Any:
    pid = str(os.getpid())

    def wsgi(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, [*headers, ("X-Worker", pid)], exc_info)

        return inner(environ, start)

    return wsgi


_config = config.load()
app.wsgi_app = WSGIRateLimitMiddleware(app.wsgi_app, **config.middleware_kwargs(_config))  # type: ignore[method-assign]
application = _with_worker_pid(app.wsgi_app)
app.wsgi_app = application  # type: ignore[method-assign]
