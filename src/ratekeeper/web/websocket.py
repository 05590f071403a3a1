"""``WebSocketLimits``: an ASGI middleware limiting the messages a WebSocket receives.

Each ``websocket.receive`` message is charged, before the app sees it, to a limit per
connection (a rule keyed by an id of the connection) and/or a limit per key (a rule
keyed by a template or a callable over the scope; the client's address by default, so
one client's connections share it). Both rules are charged together: a message is
admitted by both or charged to neither. A refused message either closes the socket with
1008 (policy violation) and a reason, the app then receiving ``websocket.disconnect``,
or is dropped, the connection staying open (``on_limit="close" | "drop"``).

HTTP requests and lifespan pass through untouched, so the HTTP middleware's hot path
does not change; lifespan's shutdown closes the store when this middleware opened it.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal

from ratekeeper.errors import ConfigurationError
from ratekeeper.keys import bounded_key
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.rule import Rule

__all__ = ["WebSocketLimits"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
KeyFunction = Callable[[Scope], str]

POLICY_VIOLATION = 1008


class WebSocketLimits:
    """Limits the messages each WebSocket of ``app`` receives.

    ``per_connection``: a rule charged once per message, keyed by the connection.
    ``per_key``: a rule charged once per message, keyed by ``key``: a callable given the
    scope, or a template whose fields are ``{client}`` (the peer's address) and ``{path}``;
    the peer's address when None. ``on_limit``: ``"close"`` closes the socket with 1008
    and ``reason``; ``"drop"`` drops the message. ``limiter`` decides (any store), else
    one is opened on ``store``.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        per_connection: Rule | None = None,
        per_key: Rule | None = None,
        key: str | KeyFunction | None = None,
        on_limit: Literal["close", "drop"] = "close",
        reason: str = "message rate limit exceeded",
        limiter: AsyncLimiter | None = None,
        store: str = "memory://",
    ) -> None:
        if per_connection is None and per_key is None:
            raise ConfigurationError("WebSocketLimits needs per_connection, per_key or both")
        if on_limit not in ("close", "drop"):
            raise ConfigurationError(f"on_limit must be 'close' or 'drop', not {on_limit!r}")
        if len(reason.encode()) > 123:  # a close frame's reason is at most 123 bytes
            raise ConfigurationError("reason is longer than the 123 bytes a close frame holds")
        self.app = app
        self.per_connection = per_connection
        self.per_key = per_key
        self.key: KeyFunction = _key_function(key)
        self.on_limit = on_limit
        self.reason = reason
        self._owns_limiter = limiter is None
        self.limiter = limiter if limiter is not None else AsyncLimiter(store)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "lifespan" and self._owns_limiter:
            await self.app(scope, receive, self._lifespan_send(send))
        else:
            await self.app(scope, receive, send)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        items: list[tuple[Rule, str]] = []
        connection = uuid.uuid4().hex
        if self.per_connection is not None:
            items.append((self.per_connection, connection))
        if self.per_key is not None:
            # a template's {path} or a callable's value comes from the client: bounded as the
            # HTTP middleware bounds its keys (a readable prefix and a digest of the whole)
            items.append((self.per_key, bounded_key(self.key(scope))))
        closed = False

        async def limited_receive() -> Message:
            nonlocal closed
            while True:
                if closed:
                    return {"type": "websocket.disconnect", "code": POLICY_VIOLATION, "reason": self.reason}
                message = await receive()
                if message["type"] != "websocket.receive":
                    return message
                if await self.limiter.try_acquire_many(items):
                    return message
                if self.on_limit == "close":
                    closed = True
                    await send({"type": "websocket.close", "code": POLICY_VIOLATION, "reason": self.reason})
                # dropped: wait for the next message

        async def guarded_send(message: Message) -> None:
            # once this middleware closed the socket, the app's further sends have nowhere to go
            if not closed:
                await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        finally:
            if self.per_connection is not None:
                # the connection's id is never seen again: its state need not wait to expire
                await self.limiter.reset(self.per_connection, connection)

    def _lifespan_send(self, send: Send) -> Send:
        async def lifespan_send(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await self.limiter.aclose()
            await send(message)

        return lifespan_send


def _key_function(key: str | KeyFunction | None) -> KeyFunction:
    """The per-key rule's key of a scope, from the ``key`` option."""
    if callable(key):
        return key
    template = "{client}" if key is None else key

    def from_template(scope: Scope) -> str:
        client = scope.get("client")
        fields = {"client": client[0] if client else "unknown", "path": scope.get("path", "")}
        return template.format_map(fields)

    try:
        from_template({"client": ("0.0.0.0", 0), "path": "/"})
    except (KeyError, ValueError, IndexError) as exc:
        raise ConfigurationError(f"key template {template!r} may use only {{client}} and {{path}}: {exc}") from exc
    return from_template
