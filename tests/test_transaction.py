"""The one request transaction (``ratekeeper.limiter.transaction``), driven step by step
without I/O, and by both drivers against a real memory store."""

from __future__ import annotations

import asyncio

from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.decision import BatchDecision, Decision
from ratekeeper.limiter import drive, drive_async
from ratekeeper.limiter.transaction import Acquire, Entry, Peek, transaction
from ratekeeper.testing import FakeClock

ENFORCED = Rule("tx.enforced", "1/minute")
SHADOW = Rule("tx.shadow", "5/minute")


def test_the_steps_of_a_refused_request_peek_the_shadow_rules_instead_of_charging_them() -> None:
    flow = transaction([Entry(ENFORCED, "k"), Entry(SHADOW, "k", shadow=True)])
    (first,) = next(flow)
    assert Acquire(((ENFORCED, "k", 1),)) == first
    refused = Decision.make("tx.enforced", ENFORCED.limits, False, 0, 1_000_000, 0, (0,), (1_000_000,))
    (second,) = flow.send([BatchDecision((refused,))])
    assert Peek(SHADOW, "k", 1) == second


def test_the_steps_of_an_admitted_request_charge_the_shadow_rules() -> None:
    flow = transaction([Entry(ENFORCED, "k"), Entry(SHADOW, "k", shadow=True)])
    next(flow)
    admitted = Decision.make("tx.enforced", ENFORCED.limits, True, -1, 0, 0, (0,), (60_000_000,))
    (second,) = flow.send([BatchDecision((admitted,))])
    assert Acquire(((SHADOW, "k", 1),)) == second


def test_both_drivers_charge_nothing_for_a_refused_request() -> None:
    limiter = Limiter("memory://", clock=FakeClock())
    entries = [Entry(ENFORCED, "k"), Entry(SHADOW, "k", shadow=True)]
    outcomes = [drive.run_transaction(limiter, entries) for _ in range(3)]
    assert [True, False, False] == [o.allowed for o in outcomes]
    # one admitted request charged it (a peek tells what one more would leave: 5 - 1 - 1)
    assert 3 == limiter.peek(SHADOW, "k").remaining
    assert [] == list(outcomes[1].charged)

    async def main() -> list[bool]:
        alimiter = AsyncLimiter("memory://", clock=FakeClock())
        got = [(await drive_async.run_transaction(alimiter, entries)).allowed for _ in range(3)]
        assert 3 == (await alimiter.peek(SHADOW, "k")).remaining
        return got

    assert [True, False, False] == asyncio.run(main())
