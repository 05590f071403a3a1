"""A real uvicorn server for the web tests: an ASGI app served on 127.0.0.1 in a thread.

The listening socket is bound (port 0) before the server starts, so there is no window
in which another process can take the port; the context manager returns once uvicorn
has started (bounded wait) and stops it on exit, also when the test failed.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

__all__ = ["serve"]

START_TIMEOUT = 10.0


@contextmanager
def serve(app: Any, *, lifespan: str = "on") -> Iterator[str]:
    """Serve ``app`` and yield its base URL, ``http://127.0.0.1:<port>``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # proxy_headers off: uvicorn would otherwise rewrite the peer from X-Forwarded-For itself
    config = uvicorn.Config(
        app, log_level="warning", lifespan=lifespan, loop="asyncio", ws="websockets-sansio", proxy_headers=False
    )
    server = uvicorn.Server(config)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT
    while not server.started:
        if errors or not thread.is_alive():
            sock.close()
            raise RuntimeError(f"uvicorn did not start: {errors!r}")
        if time.monotonic() > deadline:
            server.should_exit = True
            thread.join(START_TIMEOUT)
            sock.close()
            raise RuntimeError("uvicorn did not start within 10 s")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT)
        sock.close()
        if errors:
            raise errors[0]
