"""The coalescing queue of the PostgreSQL store (no I/O): one statement per busy row at a
time, a row's ops in arrival order, at most ``max_in_flight`` statements."""

from __future__ import annotations

from ratekeeper import Rule
from ratekeeper.stores import wire
from ratekeeper.stores.postgres_core import Batch

PLAN = Rule("batch", ["5/s"])._plan


def op(key: str) -> wire.Op:
    return (wire.DECIDE, PLAN, key, 1, None, None)


def test_a_busy_rows_ops_wait_and_then_go_together_in_order() -> None:
    batch: Batch[str] = Batch(max_in_flight=4)
    assert batch.can_send_now(op("hot"))
    batch.start([op("hot")])
    assert not batch.can_send_now(op("hot"))  # one statement per row at a time
    for name in ("w1", "w2", "w3"):
        batch.queue.append((op("hot"), None, name))
    assert batch.take() is None  # the row is busy
    batch.finish([op("hot")])
    taken = batch.take()
    assert taken is not None
    ops, now, waiters = taken
    assert (len(ops), now, waiters) == (3, None, ["w1", "w2", "w3"])
    assert batch.in_flight == 1
    assert not batch.queue


def test_other_rows_go_past_a_busy_one_but_a_rows_order_holds() -> None:
    batch: Batch[str] = Batch(max_in_flight=4)
    batch.start([op("a")])
    batch.queue.extend([(op("a"), None, "a1"), (op("b"), None, "b1"), (op("a"), None, "a2")])
    taken = batch.take()
    assert taken is not None and taken[2] == ["b1"]
    assert [w for _, _, w in batch.queue] == ["a1", "a2"]


def test_ops_with_another_now_wait_for_their_own_statement() -> None:
    batch: Batch[str] = Batch(max_in_flight=4)
    batch.queue.extend([(op("a"), 1, "a@1"), (op("b"), 2, "b@2"), (op("b"), 1, "b@1"), (op("c"), 1, "c@1")])
    first = batch.take()
    assert first is not None and (first[1], first[2]) == (1, ["a@1", "c@1"])  # b@1 must not overtake b@2
    second = batch.take()
    assert second is not None and (second[1], second[2]) == (2, ["b@2"])


def test_no_more_than_max_in_flight_statements() -> None:
    batch: Batch[str] = Batch(max_in_flight=1)
    batch.start([op("a")])
    batch.queue.append((op("b"), None, "b"))
    assert not batch.can_send_now(op("c"))
    assert batch.take() is None
    batch.finish([op("a")])
    assert batch.take() is not None
