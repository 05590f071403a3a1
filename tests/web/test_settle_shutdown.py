"""A settlement still running when the app shuts down is written before the shutdown
completes (ASGI lifespan), after which the server exits and the core closes the store it
made: the response ended, Starlette cancelled its task, the charge goes on."""

from __future__ import annotations

import asyncio
from typing import Any

from ratekeeper import Rule
from ratekeeper.config.model import HttpRule, KeyTemplate
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.stores.url import open_store
from ratekeeper.testing import FakeClock
from ratekeeper.web import RateLimitMiddleware

RULE = HttpRule(Rule("tokens", "100/minute", "fixed_window"), key=KeyTemplate.parse("{client_ip}"))
SCOPE = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "client": ("10.0.0.9", 5000)}


class Gated(AsyncLimiter):
    """Charges only once ``gate`` is set; tells ``events`` when it charged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()
        self.events: list[str] = []

    async def charge(self, rule: Rule, key: str, cost: int, *, now: int | None = None) -> Any:
        await self.gate.wait()
        decision = await super().charge(rule, key, cost, now=now)
        self.events.append(f"charged {cost}")
        return decision


def test_shutdown_waits_for_the_settlement_of_a_response_that_already_ended() -> None:
    async def main() -> list[str]:
        limiter = Gated(open_store("memory://", clock=FakeClock()))
        body_sent = asyncio.Event()

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                while True:
                    message = await receive()
                    if message["type"] == "lifespan.startup":
                        await send({"type": "lifespan.startup.complete"})
                    else:
                        await send({"type": "lifespan.shutdown.complete"})
                        return
            await send({"type": "http.response.start", "status": 200, "headers": [(b"x-tokens-used", b"40")]})
            await send({"type": "http.response.body", "body": b"done"})

        middleware = RateLimitMiddleware(app, rules=[RULE], limiter=limiter, response_cost="x-tokens-used")

        async def send_http(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                body_sent.set()

        async def receive_http() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        request = asyncio.create_task(middleware(dict(SCOPE), receive_http, send_http))
        await body_sent.wait()
        request.cancel()  # as Starlette cancels its streaming task once the response is out

        lifespan = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

        async def receive_lifespan() -> dict[str, Any]:
            message = next(lifespan)
            if message["type"] == "lifespan.shutdown":
                # the store answers the charge only on the loop's next turn: after a
                # shutdown that did not wait for it
                asyncio.get_running_loop().call_soon(limiter.gate.set)
            return message

        async def send_lifespan(message: dict[str, Any]) -> None:
            limiter.events.append(message["type"])

        await middleware({"type": "lifespan"}, receive_lifespan, send_lifespan)
        await asyncio.gather(request, return_exceptions=True)
        return limiter.events

    events = asyncio.run(main())
    assert ["lifespan.startup.complete", "charged 39", "lifespan.shutdown.complete"] == events
