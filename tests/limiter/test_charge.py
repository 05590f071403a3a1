"""``Limiter.charge`` / ``AsyncLimiter.charge``: a cost known only after the fact, charged
without a check on every store the limiters open; the key is then in debt and refused
until time has paid it back."""

from __future__ import annotations

import asyncio

import pytest

from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.errors import InvalidRequest
from ratekeeper.testing import FakeClock

TOKENS = Rule("tokens", "100/min", algorithm="token_bucket")


def test_a_charge_past_what_is_left_puts_the_key_in_debt_until_the_refill_pays_it_back() -> None:
    clock = FakeClock()
    with Limiter("memory://", clock=clock) as limiter:
        assert limiter.try_acquire(TOKENS, "key-1", 10).allowed
        after = limiter.charge(TOKENS, "key-1", 130)  # the answer's real size, known at its end
        assert after.allowed and after.remaining == -40
        assert not limiter.try_acquire(TOKENS, "key-1").allowed
        assert limiter.try_acquire(TOKENS, "key-2").allowed  # another key owes nothing
        clock.advance(24.6)  # 41 tokens at 0.6 s each: out of debt, one in hand
        assert limiter.try_acquire(TOKENS, "key-1").allowed


def test_the_asyncio_limiter_charges_alike() -> None:
    async def run() -> tuple[int, bool]:
        async with AsyncLimiter("memory://", clock=FakeClock()) as limiter:
            after = await limiter.charge(TOKENS, "key", 150)
            return after.remaining, (await limiter.try_acquire(TOKENS, "key")).allowed

    assert asyncio.run(run()) == (-50, False)


def test_a_charge_is_checked_as_try_acquire_checks_its_cost() -> None:
    with Limiter("memory://") as limiter:
        with pytest.raises(InvalidRequest):
            limiter.charge(TOKENS, "key", -1)
        with pytest.raises(InvalidRequest, match="charge without a check holds no lease"):
            limiter.charge(Rule("slots", "3/min", algorithm="concurrency"), "key", 1)


def test_the_deepest_debt_is_one_limit_deep() -> None:
    with Limiter("memory://") as limiter:
        assert limiter.charge(TOKENS, "key", 10**9).remaining == -100


def test_a_store_that_fails_under_allow_answers_a_charge_as_charged_to_a_whole_key() -> None:
    with Limiter("redis://127.0.0.1:1/0", on_error="allow", timeout=0.5) as limiter:
        after = limiter.charge(TOKENS, "key", 130)
    assert after.allowed and after.remaining == -30 and after.fallback == "allow"
