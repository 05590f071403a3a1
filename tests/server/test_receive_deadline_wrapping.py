"""``ReceiveDeadline`` wraps each method's handler once, not on every call: the wrapped
handler a call gets is the same object for every call of one method, and its own for
each method. (That the wrapped handler ends a call whose message never comes is
``test_defences_grpc_receive``'s, against the real service.)"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from ratekeeper.server.grpc_service import ReceiveDeadline


async def _answer(request: Any, context: Any) -> Any:
    return request


def test_each_methods_handler_is_wrapped_once_and_kept() -> None:
    check = grpc.unary_unary_rpc_method_handler(_answer)
    health = grpc.unary_unary_rpc_method_handler(_answer)
    deadline = ReceiveDeadline(5.0)

    async def handler_for(handler: Any) -> Any:
        async def continuation(details: Any) -> Any:
            return handler

        return await deadline.intercept_service(continuation, None)

    async def main() -> list[Any]:
        return [await handler_for(h) for h in (check, check, health, check, health)]

    first, again, other, third, other_again = asyncio.run(main())
    assert first.request_streaming and not first.response_streaming  # read under the timer
    assert first is again is third
    assert other is other_again and other is not first
    streaming = grpc.stream_unary_rpc_method_handler(_answer)

    async def passed() -> Any:
        return await handler_for(streaming)

    assert asyncio.run(passed()) is streaming  # a stream reads as it goes: left as it is
