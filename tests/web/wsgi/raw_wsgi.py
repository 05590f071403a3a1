"""A bare WSGI app (no framework) for what Flask never does: raising out of the app, and
replacing a started response with an error page through ``start_response(..., exc_info)``.

Routes: ``/health``; ``/raise`` raises before ``start_response`` (gunicorn answers its own
500); ``/error-page`` starts a 200, then replaces it with a 503 from an ``except`` block;
anything else answers 200 with a streamed body of three chunks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ratekeeper.web import WSGIRateLimitMiddleware
from web.wsgi import config


def _app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    path = environ["PATH_INFO"]
    if path == "/raise":
        raise RuntimeError("the app failed before answering")
    if path == "/error-page":
        return _error_page(start_response)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return iter([b"one\n", b"two\n", b"three\n"])


def _error_page(start_response: Callable[..., Any]) -> Iterator[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    try:
        raise ValueError("failed while preparing the body")
    except ValueError:
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")], sys.exc_info())
    yield b"error page\n"


app = WSGIRateLimitMiddleware(_app, **config.middleware_kwargs(config.load()))
