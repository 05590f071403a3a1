"""A Flask app with the ratekeeper extension on werkzeug's threaded server, for the tests
that need a real server; the extension's core is closed when the server stops."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from flask import Flask
from werkzeug.serving import make_server


@contextmanager
def serving(app: Flask) -> Iterator[httpx.Client]:
    """``app`` on werkzeug's threaded server; a client whose base URL is that server."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_port}", timeout=10.0) as client:
            yield client
    finally:
        server.shutdown()
        thread.join(timeout=5)
        state = app.extensions["ratekeeper"]
        if state.core is not None:
            state.core.close()
