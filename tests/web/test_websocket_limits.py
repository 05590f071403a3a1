"""``WebSocketLimits`` under a real uvicorn, with a real WebSocket client (``websockets``).

The app echoes every message it receives, so the client sees exactly which messages
reached it, in order.
"""

from __future__ import annotations

import threading

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from ratekeeper import Rule
from ratekeeper.decision import Decision
from ratekeeper.errors import ConfigurationError
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.testing import FakeClock, RecordingObserver
from ratekeeper.web.websocket import POLICY_VIOLATION, Message, Receive, Scope, Send, WebSocketLimits

from .uvicorn_server import serve

TIMEOUT = 10.0


class CountingObserver(RecordingObserver):
    """Sets ``reached`` once the limiter has made ``count`` decisions."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.reached = threading.Event()

    def decided(self, decision: Decision) -> None:
        super().decided(decision)
        if len(self.decisions) >= self.count:
            self.reached.set()


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Accepts a WebSocket and echoes each text message until the peer goes away; answers
    lifespan, so that its shutdown reaches the middleware and closes the store."""
    if scope["type"] == "lifespan":
        while True:
            event = await receive()
            await send({"type": event["type"] + ".complete"})
            if event["type"] == "lifespan.shutdown":
                return
    if scope["type"] != "websocket":
        return
    while True:
        message: Message = await receive()
        if message["type"] == "websocket.connect":
            await send({"type": "websocket.accept"})
        elif message["type"] == "websocket.receive":
            await send({"type": "websocket.send", "text": message.get("text")})
        else:
            return


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/ws"


def test_the_message_past_the_connection_limit_closes_with_1008(store_url: str, rule_name: str) -> None:
    app = WebSocketLimits(echo, per_connection=Rule(rule_name, "3/minute"), store=store_url, reason="slow down")
    with serve(app) as base, connect(ws_url(base), open_timeout=TIMEOUT, close_timeout=TIMEOUT) as ws:
        for text in ("a", "b", "c"):
            ws.send(text)
            assert ws.recv(timeout=TIMEOUT) == text
        ws.send("d")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=TIMEOUT)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (POLICY_VIOLATION, "slow down")


def test_a_new_connection_has_its_own_connection_limit(rule_name: str) -> None:
    app = WebSocketLimits(echo, per_connection=Rule(rule_name, "1/minute"))
    with serve(app) as base:
        for _ in range(2):
            with connect(ws_url(base), open_timeout=TIMEOUT, close_timeout=TIMEOUT) as ws:
                ws.send("a")
                assert ws.recv(timeout=TIMEOUT) == "a"


def test_drop_mode_keeps_the_connection_and_drops_the_extra_messages(rule_name: str) -> None:
    clock = FakeClock()
    observer = CountingObserver(5)
    limiter = AsyncLimiter("memory://", clock=clock, observer=observer)
    app = WebSocketLimits(
        echo, per_connection=Rule(rule_name, "2/minute", "fixed_window"), on_limit="drop", limiter=limiter
    )
    with serve(app) as base, connect(ws_url(base), open_timeout=TIMEOUT, close_timeout=TIMEOUT) as ws:
        for text in ("a", "b"):
            ws.send(text)
            assert ws.recv(timeout=TIMEOUT) == text
        ws.send("c")
        ws.send("d")
        ws.send("x")
        # "c", "d" and "x" refused and dropped (five decisions) before the window turns;
        # the app reads in order, so had any reached it, it would be echoed before "e".
        assert observer.reached.wait(TIMEOUT)
        assert [bool(d) for d in observer.decisions] == [True, True, False, False, False]
        clock.advance(60)
        ws.send("e")
        assert ws.recv(timeout=TIMEOUT) == "e"


def test_a_per_key_limit_spans_two_connections_from_one_client(store_url: str, rule_name: str) -> None:
    app = WebSocketLimits(echo, per_key=Rule(rule_name, "3/minute"), store=store_url)
    with serve(app) as base:
        with connect(ws_url(base), open_timeout=TIMEOUT, close_timeout=TIMEOUT) as first:
            for text in ("a", "b"):
                first.send(text)
                assert first.recv(timeout=TIMEOUT) == text
        with connect(ws_url(base), open_timeout=TIMEOUT, close_timeout=TIMEOUT) as second:
            second.send("c")
            assert second.recv(timeout=TIMEOUT) == "c"
            second.send("d")
            with pytest.raises(ConnectionClosed) as closed:
                second.recv(timeout=TIMEOUT)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == POLICY_VIOLATION


def test_a_message_refused_by_one_rule_is_charged_to_neither(rule_name: str) -> None:
    clock = FakeClock()
    observer = CountingObserver(6)  # a decision per rule and message
    limiter = AsyncLimiter("memory://", clock=clock, observer=observer)
    app = WebSocketLimits(
        echo,
        per_connection=Rule(f"{rule_name}.c", "3/hour", "fixed_window"),
        per_key=Rule(f"{rule_name}.k", "2/minute", "fixed_window"),
        on_limit="drop",
        limiter=limiter,
    )
    with serve(app) as base, connect(ws_url(base), open_timeout=TIMEOUT, close_timeout=TIMEOUT) as ws:
        for text in ("a", "b"):
            ws.send(text)
            assert ws.recv(timeout=TIMEOUT) == text
        ws.send("c")  # refused by the per-key rule: the connection's third message is still free
        assert observer.reached.wait(TIMEOUT)
        assert [bool(d) for d in observer.decisions] == [True, True, True, True, True, False]
        clock.advance(60)
        ws.send("d")
        assert ws.recv(timeout=TIMEOUT) == "d"


def test_a_key_callable_is_given_the_scope() -> None:
    seen: list[str] = []

    def key(scope: Scope) -> str:
        seen.append(scope["path"])
        return "k"

    app = WebSocketLimits(
        echo, per_connection=Rule("ws.both.c", "5/minute"), per_key=Rule("ws.both.k", "5/minute"), key=key
    )
    assert app.key({"path": "/ws"}) == "k" and seen == ["/ws"]


def test_a_key_template_names_the_client_and_the_path() -> None:
    app = WebSocketLimits(echo, per_key=Rule("ws.tpl", "1/minute"), key="{client}:{path}")
    assert app.key({"client": ("10.0.0.1", 5000), "path": "/chat"}) == "10.0.0.1:/chat"
    assert WebSocketLimits(echo, per_key=Rule("ws.tpl", "1/minute")).key({"client": None}) == "unknown"


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"per_key": Rule("ws.bad", "1/minute"), "on_limit": "ignore"},
        {"per_key": Rule("ws.bad", "1/minute"), "key": "{host}"},
        {"per_key": Rule("ws.bad", "1/minute"), "reason": "x" * 124},
    ],
)
def test_an_unusable_configuration_is_refused(options: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        WebSocketLimits(echo, **options)  # type: ignore[arg-type]


def test_a_key_from_a_long_path_is_bounded_and_still_limits(store_url: str, rule_name: str) -> None:
    """``{path}`` is the client's: a path far longer than a store's keys is bounded (a prefix
    and a digest of the whole), so the message is decided and counted, never an error."""
    app = WebSocketLimits(echo, per_key=Rule(rule_name, "1/minute"), key="{path}", store=store_url)
    with serve(app) as base:
        url = base.replace("http://", "ws://") + "/" + "p" * 4000
        with connect(url, open_timeout=TIMEOUT, close_timeout=TIMEOUT) as ws:
            ws.send("a")
            assert ws.recv(timeout=TIMEOUT) == "a"
            ws.send("b")
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=TIMEOUT)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == POLICY_VIOLATION
