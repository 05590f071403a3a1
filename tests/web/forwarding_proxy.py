"""A small reverse proxy for the tests, in front of an app as nginx or Envoy would be.

It is an ASGI app (served by a real uvicorn, ``uvicorn_server.serve``) that sends each
request on to ``backend`` with httpx and answers what the backend answered. On the way
it adds what the proxy in front of a real deployment adds, and nothing else (the
client's own forwarding headers pass through untouched, as nginx passes them):

- ``mode="x-forwarded-for"``: nginx's ``$proxy_add_x_forwarded_for``, the client's
  ``X-Forwarded-For`` (if any) with ``, <client address>`` appended;
- ``mode="forwarded"``: an RFC 7239 element ``for="<client address>"`` appended to the
  client's ``Forwarded`` (if any);
- ``mode="forwarded-unknown"``: ``for=unknown`` appended (a proxy hiding its clients);
- ``mode="forwarded-obfuscated"``: ``for=_<hash of the client address>`` appended (a
  proxy giving each client an opaque name, RFC 7239 §6.3).

The client address is the TCP peer uvicorn reports: tests connect from their own
loopback address (``127.x.y.z``) so that each simulated client is a real, distinct peer.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from .uvicorn_server import serve

__all__ = ["FORGED", "MODES", "client", "fresh_loopback", "proxy"]

MODES = ("x-forwarded-for", "forwarded", "forwarded-unknown", "forwarded-obfuscated")

_HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"content-length"}


def _appended(mode: str, address: str) -> tuple[bytes, bytes]:
    """The header this proxy appends to, and the entry it appends for the client ``address``."""
    if mode == "x-forwarded-for":
        return b"x-forwarded-for", address.encode()
    node = f'"[{address}]"' if ":" in address else address
    if mode == "forwarded-unknown":
        node = "unknown"
    elif mode == "forwarded-obfuscated":
        node = "_" + hashlib.sha256(address.encode()).hexdigest()[:12]
    return b"forwarded", f"for={node}".encode()


class ForwardingProxy:
    """The ASGI app of the proxy (see the module docstring)."""

    def __init__(self, backend: str, mode: str, source: str | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.backend = backend
        self.mode = mode
        self.source = source
        self.http: httpx.AsyncClient | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    transport = None if self.source is None else httpx.AsyncHTTPTransport(local_address=self.source)
                    self.http = httpx.AsyncClient(base_url=self.backend, timeout=20.0, transport=transport)
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if self.http is not None:
                        await self.http.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        assert scope["type"] == "http" and self.http is not None
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        name, entry = _appended(self.mode, scope["client"][0])
        headers: list[tuple[bytes, bytes]] = []
        previous: list[bytes] = []
        for key, value in scope["headers"]:
            if key.lower() == name:
                previous.append(value)
            elif key.lower() not in _HOP_BY_HOP:
                headers.append((key, value))
        headers.append((name, b", ".join([*previous, entry])))
        path = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
        request = self.http.build_request(scope["method"], path.decode("latin-1"), headers=headers, content=body)
        response = await self.http.send(request)
        out = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP]
        out.append((b"content-length", str(len(response.content)).encode()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": out})
        await send({"type": "http.response.body", "body": response.content})


@contextmanager
def proxy(backend: str, mode: str = "x-forwarded-for", source: str | None = None) -> Iterator[str]:
    """A proxy to ``backend`` listening on 127.0.0.1; yields its base URL. It connects to
    the backend from ``source`` (a loopback address; default 127.0.0.1), the address the
    app sees it at."""
    with serve(ForwardingProxy(backend, mode, source)) as url:
        yield url


def fresh_loopback() -> str:
    """A loopback address (127.x.y.z) no other test uses: a client of its own."""
    return f"127.{random.randint(2, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


def client(base_url: str, address: str) -> httpx.Client:
    """An HTTP client connecting from ``address`` (a real, distinct TCP peer)."""
    return httpx.Client(base_url=base_url, transport=httpx.HTTPTransport(local_address=address), timeout=20.0)


FORGED: list[dict[str, str]] = [
    {"Forwarded": "for=198.51.100.1"},
    {"Forwarded": 'for="[2001:db8::1]:4711"'},
    {"Forwarded": "for=198.51.100.2;proto=https, for=198.51.100.3"},
    {"Forwarded": "for=unknown"},
    {"X-Forwarded-For": "198.51.100.4"},
    {"X-Forwarded-For": "198.51.100.5, 198.51.100.6"},
    {"X-Forwarded-For": "unknown"},
    {"X-Forwarded-For": "2001:db8::2"},
]
"""Eight different claims a client may make about itself (each forging a fresh budget
where the forwarding headers are believed blindly)."""
