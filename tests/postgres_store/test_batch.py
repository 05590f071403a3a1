"""The coalescing queue as the PostgreSQL store sets it up (no I/O): one statement per busy
row at a time, a row's ops in arrival order, at most ``max_in_flight`` statements."""

from __future__ import annotations

from ratekeeper import Rule
from ratekeeper.stores import wire
from ratekeeper.stores.coalescing import Coalescer
from ratekeeper.stores.postgres import planner
from ratekeeper.stores.postgres.errors import store_down, translate
from ratekeeper.stores.postgres.options import PostgresOptions

PLAN = Rule("batch", ["5/s"]).plan


def op(key: str) -> wire.Op:
    return wire.Op((wire.DECIDE, PLAN, key, 1, None, None))


def batch(max_in_flight: int) -> Coalescer[wire.Op, str]:
    """The PostgreSQL store's queue (``planner.queue``): one statement per row at a time."""
    return planner.queue(PostgresOptions("postgresql://nobody@127.0.0.1:1/none", max_in_flight=max_in_flight))


def test_a_busy_rows_ops_wait_and_then_go_together_in_order() -> None:
    queue = batch(max_in_flight=4)
    assert queue.start_alone(op("hot"))
    assert not queue.start_alone(op("hot"))  # one statement per row at a time
    for name in ("w1", "w2", "w3"):
        queue.push(op("hot"), None, name)
    assert queue.take() is None  # the row is busy
    queue.finish([op("hot")])
    taken = queue.take()
    assert taken is not None
    ops, now, waiters = taken
    assert (len(ops), now, waiters) == (3, None, ["w1", "w2", "w3"])
    assert queue.in_flight == 1
    assert not queue.queue


def test_other_rows_go_past_a_busy_one_but_a_rows_order_holds() -> None:
    queue = batch(max_in_flight=4)
    assert queue.start_alone(op("a"))
    for key, name in (("a", "a1"), ("b", "b1"), ("a", "a2")):
        queue.push(op(key), None, name)
    taken = queue.take()
    assert taken is not None and taken[2] == ["b1"]
    assert [w for _, _, w in queue.queue] == ["a1", "a2"]


def test_ops_with_another_now_wait_for_their_own_statement() -> None:
    queue = batch(max_in_flight=4)
    for key, now, name in (("a", 1, "a@1"), ("b", 2, "b@2"), ("b", 1, "b@1"), ("c", 1, "c@1")):
        queue.push(op(key), now, name)
    first = queue.take()
    assert first is not None and (first[1], first[2]) == (1, ["a@1", "c@1"])  # b@1 must not overtake b@2
    second = queue.take()
    assert second is not None and (second[1], second[2]) == (2, ["b@2"])


def test_no_more_than_max_in_flight_statements() -> None:
    queue = batch(max_in_flight=1)
    assert queue.start_alone(op("a"))
    queue.push(op("b"), None, "b")
    assert not queue.start_alone(op("c"))
    assert queue.take() is None
    queue.finish([op("a")])
    assert queue.take() is not None


def test_store_down_names_a_lost_or_timed_out_server_not_a_wrong_statement_nor_a_busy_pool() -> None:
    import psycopg
    import psycopg_pool

    def translated(exc: BaseException) -> BaseException:
        error = translate(exc, "a decision")
        error.__cause__ = exc
        return error

    down = [
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        ConnectionRefusedError("refused"),
    ]
    not_down = [psycopg_pool.PoolTimeout("couldn't get a connection"), psycopg.errors.DataError("bad input")]
    assert [True] * 4 + [False] * 2 == [store_down(translated(exc)) for exc in down + not_down]
    assert not store_down(KeyboardInterrupt())
