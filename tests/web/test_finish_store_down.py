"""A refund after the response that the store fails (under ``on_error="raise"``, the one
policy that raises it) is logged by the core and never raised: the response is on its
way, whichever integration finishes it. A private Redis, stopped between the decision
and the refund."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ratekeeper import AsyncLimiter, Limiter
from ratekeeper.web.core import RateLimitCore
from ratekeeper.web.core_async import AsyncRateLimitCore
from ratekeeper.web.request import RequestView
from servers import RedisServer

from .conftest import http_rule

VIEW = RequestView("GET", "/items/a", peer="192.0.2.1")


def refusal_logged(caplog: pytest.LogCaptureFixture) -> bool:
    return any("giving back the charges of a 500 response failed" in r.getMessage() for r in caplog.records)


def test_sync_core_logs_a_failed_refund_and_raises_nothing(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = Limiter(redis_server.url, on_error="raise", timeout=0.5)
    core = RateLimitCore([http_rule("r", "5/minute")], limiter=limiter, refund_statuses={500})
    try:
        verdict = core.check(VIEW)
        assert verdict.allowed
        redis_server.stop()
        with caplog.at_level(logging.WARNING, "ratekeeper.web"):
            core.finish(verdict, 500)  # the refund fails: logged, not raised
        assert refusal_logged(caplog)
    finally:
        limiter.close()


def test_async_core_logs_a_failed_refund_and_raises_nothing(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        limiter = AsyncLimiter(redis_server.url, on_error="raise", timeout=0.5)
        core = AsyncRateLimitCore([http_rule("r", "5/minute")], limiter=limiter, refund_statuses={500})
        try:
            verdict = await core.check(VIEW)
            assert verdict.allowed
            redis_server.stop()
            with caplog.at_level(logging.WARNING, "ratekeeper.web"):
                await core.finish(verdict, 500)
        finally:
            await limiter.aclose()

    asyncio.run(main())
    assert refusal_logged(caplog)


def test_a_settlement_the_store_could_not_take_is_reported_under_the_default_policy(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Under ``on_error="allow"`` the charge of a settlement answers with the policy's
    decision instead of raising: nothing was applied, and that is reported as a failed
    settlement, not passed over."""
    limiter = Limiter(redis_server.url, on_error="allow", timeout=0.5)  # the web core's default
    core = RateLimitCore([http_rule("r", "5/minute")], limiter=limiter, response_cost="x-cost")
    try:
        verdict = core.check(VIEW)
        assert verdict.allowed
        record = core.response_record(verdict, VIEW, None)
        assert record is not None
        record.started(200, [("X-Cost", "5")])
        redis_server.stop()
        with caplog.at_level(logging.WARNING, "ratekeeper.web"):
            core.finish(verdict, 200, record)
    finally:
        limiter.close()
    assert "settling +4 for rule r after the response failed" in caplog.text
