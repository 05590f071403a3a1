"""The conformance suite's own checks: it fails stores that are wrong, and only those.

Stores here are the memory store with one deliberate change each, and the algorithms
over a plain dict. A store that forgets a state as soon as it is whole is allowed (the
Store contract lets stores forget whole states, and that only shows after the clock
steps back); forgetting a state before it is whole, answering a float where an int is
due, or charging a refused batch are not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from conformance.traces import EPOCH_US, Acquire, Advance, Batch, Disagreement, Refund, RuleSpec, Session
from ratekeeper.decision import Decision
from ratekeeper.limit import Limit
from ratekeeper.stores.memory import MemoryStore

FIXED_1_PER_10US = RuleSpec("fixed_window", (Limit.from_us(1, 10),))
GCRA_1_PER_SECOND = RuleSpec("gcra", (Limit.from_us(1, 1_000_000),))


class Altered:
    """A memory store with one change: ``after(method, args, result)`` may rewrite a result
    (or act on the store) after each call."""

    def __init__(self, after: Any = None) -> None:
        self.store = MemoryStore(stripes=1)
        self.after = after

    def call(self, method: str, *args: Any) -> Any:
        result = getattr(self.store, method)(*args)
        return self.after(self.store, method, args, result) if self.after else result


class KeepsEverything:
    """The algorithms over a plain dict: a refund that leaves a state whole keeps it."""

    def __init__(self) -> None:
        self.states: dict[tuple[str, str], Any] = {}

    def call(self, method: str, *args: Any) -> Any:
        if method == "decide":
            (_, plan, key, cost, max_wait, lease), now = args
            new, decision = plan.algorithm.decide(plan, self.states.get((plan.table, key)), now, cost, max_wait, lease)
            if args[0].charges:
                self.states[(plan.table, key)] = new
            return decision
        if method == "refund":
            (_, plan, key, cost, _, lease), now = args
            state = self.states.get((plan.table, key))
            if state is not None:
                self.states[(plan.table, key)] = plan.algorithm.refund(plan, state, now, cost, lease)
            return None
        raise NotImplementedError(method)


def test_a_store_may_forget_a_state_once_it_is_whole_even_if_the_clock_steps_back_later() -> None:
    """Fixed window 1/10µs: charged at 10 µs (window 1), the clock steps back to 5 µs and the
    charge is refunded. A store that keeps the whole state still counts in window 1 (a new
    charge resets at 20 µs); the memory store forgets it (at 10 µs): both are accepted."""
    trace = [Acquire(0, 0, 1), Advance(-5), Refund(0, 0, 1), Acquire(0, 0, 1)]
    answers: dict[str, list[Any]] = {"kept": [], "forgot": []}

    def recording(name: str, call: Any) -> Any:
        def run(method: str, *args: Any) -> Any:
            result = call(method, *args)
            answers[name].append(result)
            return result

        return run

    Session(recording("kept", KeepsEverything().call), (FIXED_1_PER_10US,), 1, 10, "k").run(trace)
    Session(recording("forgot", Altered().call), (FIXED_1_PER_10US,), 1, 10, "k").run(trace)
    assert answers["kept"][2].reset_us == (15,)  # the Acquire at 5 µs
    assert answers["forgot"][2].reset_us == (5,)


def test_a_store_that_forgets_a_state_before_it_is_whole_fails() -> None:
    def forget_everything(store: MemoryStore, method: str, args: Sequence[Any], result: Any) -> Any:
        if method == "decide":
            store.reset(args[0].plan, args[0].key)
        return result

    with pytest.raises(Disagreement, match=r"op #3 Acquire.*\n    allowed: store True, reference False"):
        Session(Altered(forget_everything).call, (GCRA_1_PER_SECOND,), 1, EPOCH_US, "t").run(
            [Acquire(0, 0, 1), Advance(500_000), Acquire(0, 0, 1)]
        )


def test_a_store_answering_a_float_for_an_integer_field_fails() -> None:
    def float_retry(store: MemoryStore, method: str, args: Sequence[Any], result: Any) -> Any:
        if method == "decide":
            fields = list(result)
            fields[4] = float(fields[4])
            return Decision(fields)
        return result

    with pytest.raises(Disagreement, match=r"retry_us: store 0\.0, reference 0"):
        Session(Altered(float_retry).call, (GCRA_1_PER_SECOND,), 1, 0, "t").run([Acquire(0, 0, 1)])


def test_a_store_that_charges_a_refused_batch_fails() -> None:
    def charge_anyway(store: MemoryStore, method: str, args: Sequence[Any], result: Any) -> Any:
        if method == "decide_many" and not all(d.allowed for d in result):
            for op in args[0]:
                store.decide(op, args[1])
        return result

    with pytest.raises(Disagreement, match=r"op #3 Acquire"):
        Session(Altered(charge_anyway).call, (GCRA_1_PER_SECOND,), 2, 0, "t").run(
            # k1 is full, so the batch is refused: k0 must stay uncharged.
            [Acquire(0, 1, 1), Batch(((0, 0, 1), (0, 1, 1))), Acquire(0, 0, 1)]
        )
