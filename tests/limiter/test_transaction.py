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


def test_the_asyncio_driver_runs_the_calls_of_a_step_together() -> None:
    """Two peeks of one step are both under way before either answers (each waits for the
    other: run one after the other, they would wait for ever)."""
    rules = [Rule("tx.a", "1/minute"), Rule("tx.b", "1/minute")]

    class Together:
        def __init__(self) -> None:
            self.entered = 0
            self.both = asyncio.Event()

        async def peek(self, rule: Rule, key: str, cost: int) -> Decision:
            self.entered += 1
            if self.entered == len(rules):
                self.both.set()
            await asyncio.wait_for(self.both.wait(), 5)
            return Decision.make(rule.name, rule.limits, True, 0, 0, 0, (0,), (60_000_000,))

    flow = transaction([Entry(rule, "k", peek=True) for rule in rules])
    outcome = asyncio.run(drive_async.drive(Together(), flow))  # type: ignore[arg-type]
    assert outcome.allowed
