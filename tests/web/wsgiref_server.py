"""A WSGI app on the standard library's server in a thread, for tests that need a real
server without a process of its own (the client's disconnect, close() called by it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

WAIT = 10.0  # bound of the server's shutdown


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def wsgiref(app: Any) -> WSGIServer:
    """``app`` on a free port of 127.0.0.1, not yet serving, logging nothing."""
    return make_server("127.0.0.1", 0, app, handler_class=_Quiet)


@contextmanager
def serving(server: WSGIServer) -> Iterator[str]:
    """``server`` serving in a thread; its base URL."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT)
