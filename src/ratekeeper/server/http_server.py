"""The HTTP listeners: uvicorn run in-process, with the defences a server exposed to
clients it does not trust needs (uvicorn has none of them by default).

``GuardedProtocol`` (uvicorn's httptools protocol, subclassed) adds, per connection:

- a read timeout: a request must arrive whole (request line, headers and body) within
  ``read_timeout`` seconds of the connection opening or of its first byte; a connection
  that sends nothing is closed, one that sent part of a request is answered 408 and
  closed (a slowloris client holds nothing for long);
- a cap on the request head (request line and headers): bytes are counted as they
  arrive, before httptools buffers a header whole, so a client streaming an endless
  header is answered 431 and closed after about ``max_header_bytes``, not after it has
  filled the memory;
- the Host field RFC 9112 §3.2 asks for: an HTTP/1.1 request without exactly one
  Host field is answered 400 and closed (HTTP/1.0 needs none);
- a cap on open connections per listener: at the cap, a new connection takes the place
  of the oldest idle one (no request in progress: keep-alive, or a request still
  arriving); only when every connection is busy is it answered 503 at once and closed.
  uvicorn's ``limit_concurrency`` is not used: it counts the idle connections too and
  answers 503 only once a request has been read, so idle connections still lock out
  every newcomer.
- with TLS, the handshake is started here (the loop's TLS protocol put on the accepted
  connection) rather than by the listening socket: a connection counts against the cap from its
  first byte, as an idle one, and its handshake must end within ``read_timeout``.
  When the event loop does the handshake (uvicorn's ``ssl=``), the protocol only learns
  of a connection once it is done, so half-open handshakes (a client that connects and
  sends nothing, or part of a ClientHello) were counted nowhere and held an open file
  each for asyncio's 60 s: enough of them exhaust the open files and lock everyone out.
  At the cap with every connection busy, a TLS newcomer is closed without a word (there
  is no TLS session yet to answer 503 in).

The keep-alive timeout is uvicorn's own (``timeout_keep_alive``).
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import itertools
import json
import resource
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ratekeeper.server.problems import problem_document
from ratekeeper.web.problem import PROBLEM_CONTENT_TYPE

__all__ = ["GuardedProtocol", "HttpLimits", "bind", "host_problem", "http_server", "raise_open_files_limit"]


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The defences of each HTTP listener (``ratekeeper serve`` options)."""

    read_timeout: float = 10.0
    keep_alive: int = 5
    max_header_bytes: int = 32 * 1024
    max_connections: int = 1000


class _Refuse(Exception):
    """Raised inside a parser callback to answer ``status`` and close the connection."""

    def __init__(self, status: int, detail: str, accepted: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.accepted = accepted


def _plain_answer(status: int, detail: str, accepted: str | None, extra: list[tuple[str, str]]) -> bytes:
    body = json.dumps(problem_document(status, detail, accepted), separators=(",", ":")).encode()
    head = [
        f"HTTP/1.1 {status} {problem_document(status, '')['title']}",
        f"content-type: {PROBLEM_CONTENT_TYPE}",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{k}: {v}" for k, v in extra),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


_HOST_ACCEPTED = "exactly one Host header field in an HTTP/1.1 request"


def host_problem(http_version: str, hosts: list[bytes]) -> str | None:
    """What is wrong with the Host fields ``hosts`` of a request, None when nothing is:
    RFC 9112 §3.2, a server MUST answer 400 to an HTTP/1.1 request without exactly one
    (an empty one is right: a target without an authority). HTTP/1.0 needs none, and
    may not send several either. The value is not checked here: no route reads it."""
    if not hosts:
        return None if http_version == "1.0" else f"an HTTP/{http_version} request without a Host header field"
    if len(hosts) > 1:
        return f"a request with {len(hosts)} Host header fields"
    return None


_arrivals = itertools.count()


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a read timeout, a head cap and a connection cap
    (and the TLS handshake under both, when ``tls``)."""

    limits: ClassVar[HttpLimits] = HttpLimits()
    tls: ClassVar[ssl.SSLContext | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._opened = 0  # the order of arrival (the loop's clock ticks too coarsely to tell)
        self._closed_by_us = False
        self._in_head = True  # the next bytes belong to a request head
        self._began = False  # part of the current request has arrived
        self._ended_now = False  # a request ended within the chunk being parsed
        self._head_bytes = 0
        self._handshaking = False  # TLS: the handshake has not ended; self.transport is the TCP one

    # -- connections ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self._handshaking:  # the TLS protocol's call: the handshake is done
            self._handshake_done(transport)
            return
        self._opened = next(_arrivals)
        if len(self.connections) >= self.limits.max_connections and not self._evict_idle():
            self.transport = transport
            self._closed_by_us = True
            if self.tls is not None:
                transport.close()  # no TLS session to answer in
                return
            transport.write(
                _plain_answer(
                    503,
                    f"this server holds {self.limits.max_connections} connections, all busy",
                    "a new connection shortly",
                    [("retry-after", "1")],
                )
            )
            transport.close()
            return
        if self.tls is not None:
            self._begin_handshake(transport)
            return
        super().connection_made(transport)
        self._start_read_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_timer()
        super().connection_lost(exc)

    # -- TLS --------------------------------------------------------------------------

    def _begin_handshake(self, transport: asyncio.Transport) -> None:
        """Count the connection now (idle: the oldest makes room first), hand its bytes
        to the loop's TLS protocol, and time the handshake with the read timer; the TLS
        protocol calls ``connection_made`` again once it is done.

        Done here, within ``connection_made``, not by ``loop.start_tls`` in a task: the
        loop starts reading when ``connection_made`` returns, and a ClientHello read
        before the task ran would reach this protocol instead of TLS."""
        self.transport = transport  # until the handshake ends: what the timer and an eviction close
        self._handshaking = True
        self.connections.add(self)
        self._start_read_timer()
        done = self.loop.create_future()
        done.add_done_callback(self._handshake_over)
        assert self.tls is not None
        secure = _tls_protocol(self.loop)(
            self.loop,
            self,
            self.tls,
            done,
            server_side=True,
            # the read timer closes it first; this is the loop's own bound, a little later
            ssl_handshake_timeout=self.limits.read_timeout + 1,
        )
        transport.set_protocol(secure)
        secure.connection_made(transport)

    def _handshake_done(self, transport: asyncio.Transport) -> None:
        self._handshaking = False
        self.connections.discard(self)  # counted again by connection_made
        super().connection_made(transport)
        self._start_read_timer()  # the first request's own read timeout

    def _handshake_over(self, done: asyncio.Future[None]) -> None:
        """The TLS protocol's waiter: a handshake that failed (an error, the timer, an
        eviction, a client that left) leaves nothing counted."""
        if not done.cancelled():
            done.exception()  # retrieved: a failed handshake is the client's affair
        if self._handshaking:
            self._handshaking = False
            self._closed_by_us = True
            self._cancel_read_timer()
            self.connections.discard(self)
            if not self.transport.is_closing():
                self.transport.abort()

    def pause_writing(self) -> None:
        if self.flow is not None:  # None while the handshake writes
            super().pause_writing()

    def resume_writing(self) -> None:
        if self.flow is not None:
            super().resume_writing()

    def _idle(self) -> bool:
        """No request is being answered: closing loses no answer."""
        return not self._closed_by_us and (self.cycle is None or self.cycle.response_complete) and not self.pipeline

    def _evict_idle(self) -> bool:
        """Close the oldest idle connection of this listener, to make room; False when none is idle."""
        idle = [p for p in self.connections if isinstance(p, GuardedProtocol) and p._idle()]
        if not idle:
            return False
        oldest = min(idle, key=lambda p: p._opened)
        oldest._closed_by_us = True
        self.connections.discard(oldest)
        oldest._cancel_read_timer()
        oldest.transport.close()
        return True

    # -- the read timeout -----------------------------------------------------------

    def _start_read_timer(self) -> None:
        self._cancel_read_timer()
        self._read_timer = self.loop.call_later(self.limits.read_timeout, self._read_timed_out)

    def _cancel_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle if self.cycle is not None and not self.cycle.response_complete else None
        answered_early = cycle is None and self.cycle is not None and not self._in_head
        if answered_early or (cycle is not None and cycle.response_started):
            # The request was answered, or its answer is on its way, before its body came
            # whole (a 413 on Content-Length): one answer a request, nothing to add.
            self._close()
        elif self._began or cycle is not None:
            self._answer_and_close(
                408,
                f"the request did not arrive whole within {self.limits.read_timeout:g} s",
                f"a whole request within {self.limits.read_timeout:g} s",
            )
        else:
            self._close()  # connected and sent nothing

    # -- answering outside the application --------------------------------------------

    def _close(self) -> None:
        self._closed_by_us = True
        self._cancel_read_timer()
        if self.cycle is not None and not self.cycle.response_complete:
            # The application may still be running: whatever it sends now is dropped.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()

    def _answer_and_close(self, status: int, detail: str, accepted: str | None = None) -> None:
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.write(_plain_answer(status, detail, accepted, []))
        self._close()

    # -- parsing ----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._closed_by_us:
            return
        self._unset_keepalive_if_required()
        counting = self._in_head
        self._ended_now = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refused = exc.__context__
            if isinstance(refused, _Refuse):
                self._answer_and_close(refused.status, refused.detail, refused.accepted)
                return
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            # No upgrade is served here (no WebSocket route; uvicorn's WebSocket protocol is
            # off, so the request reached the application as plain HTTP). The parser reads
            # nothing past an upgrade request: close once it is answered, or now.
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.keep_alive = False
            else:
                self._close()
            return
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        if counting and self._in_head and not self._ended_now and not self._closed_by_us:
            # httptools keeps an unfinished header whole in memory: count what arrives.
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._answer_and_close(*self._head_too_large())

    def _head_too_large(self) -> tuple[int, str, str]:
        cap = self.limits.max_header_bytes
        return (
            431,
            f"the request line and headers are larger than {cap} bytes",
            f"a request line and headers of at most {cap} bytes",
        )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._began = True
        self._head_bytes = 0
        if self._read_timer is None:
            self._start_read_timer()

    def on_headers_complete(self) -> None:
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.limits.max_header_bytes:
            raise _Refuse(*self._head_too_large())
        wrong_host = host_problem(self.parser.get_http_version(), [v for n, v in self.headers if n == b"host"])
        if wrong_host is not None:
            raise _Refuse(400, wrong_host, _HOST_ACCEPTED)
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._cancel_read_timer()
        self._in_head = True
        self._began = False
        self._ended_now = True
        self._head_bytes = 0
        super().on_message_complete()


def _tls_protocol(loop: asyncio.AbstractEventLoop) -> Any:
    """The TLS protocol class of ``loop``: the one its own servers use (uvloop's for a
    uvloop loop: asyncio's expects transport methods uvloop's transports do not have)."""
    try:
        import uvloop.loop
    except ModuleNotFoundError:  # pragma: no cover - uvicorn[standard] brings it
        return asyncio.sslproto.SSLProtocol
    if isinstance(loop, uvloop.loop.Loop):
        return uvloop.loop.SSLProtocol
    return asyncio.sslproto.SSLProtocol


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (each connection
    is a file); the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return int(soft)


def bind(host: str, port: int, what: str, reuse_port: bool = False) -> socket.socket:
    """A listening-ready socket on ``host:port``; a busy port is a clear ``OSError``.
    ``reuse_port``: other processes of this user may listen on the same port
    (``SO_REUSEPORT``, the workers of ``ratekeeper serve --workers``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind the {what} port {host}:{port}: {exc.strerror}") from exc
    return sock


def http_server(app: Any, limits: HttpLimits, context: ssl.SSLContext | None, grace: float) -> Any:
    """A ``uvicorn.Server`` for ``app`` with ``limits`` (and TLS when ``context``)."""
    protocol = type("GuardedProtocol", (GuardedProtocol,), {"limits": limits, "tls": context})

    class Server(uvicorn.Server):
        """uvicorn without its own signal handlers: this process handles the signals."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    config = uvicorn.Config(
        app,
        http=protocol,
        loop="none",
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
        server_header=False,
        ws="none",  # no WebSocket route: an Upgrade request is answered as plain HTTP
        timeout_keep_alive=limits.keep_alive,
        timeout_graceful_shutdown=int(grace),
        backlog=2048,
        # No ssl= for uvicorn: the protocol does the handshake, under the cap and the timer.
    )
    return Server(config)
