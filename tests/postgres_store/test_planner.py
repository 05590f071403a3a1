"""The PostgreSQL store's planner without I/O: which statement each call takes and what it
sends, and how each form of reply is read."""

from __future__ import annotations

from typing import Any

from ratekeeper.op import Op
from ratekeeper.rule import Rule
from ratekeeper.stores import wire
from ratekeeper.stores.postgres.planner import PostgresPlanner

PLANNER = PostgresPlanner("postgresql://nobody@127.0.0.1:1/none")


def test_lone_decides_and_peeks_take_the_single_path() -> None:
    planner = PostgresPlanner("postgresql://nobody@127.0.0.1:1/none?schema=rk_routing&prefix=p:")
    plan = Rule("tb", ["5/s", "20/min"], "token_bucket").plan
    gcra_one = Rule("g", ["5/s"], "gcra").plan
    gcra_two = Rule("g2", ["5/s", "20/min"], "gcra").plan
    leases = Rule("c", ["3/min"], "concurrency").plan
    key = wire.storage_key("p:", plan, "k")
    assert planner.plan([Op.decide(plan, "k", 2)], 7) == (
        planner.decide_single_sql,
        (key, "7,0,1,d,1," + tb(plan) + ",2,,"),
    )
    assert planner.plan([Op.peek(plan, "k", 1)], None) == (
        planner.decide_single_sql,
        (key, ",0,1,p,1," + tb(plan) + ",1,,"),
    )
    assert planner.plan([Op.decide(plan, "k", 2)], 7, atomic=True)[1] == (key, "7,1,1,d,1," + tb(plan) + ",2,,")
    assert planner.plan([Op.decide(plan, "k", 1 << 70)], 7)[1][1] == f"7,0,1,d,1,{tb(plan)},{1 << 62},,"
    assert planner.plan([(wire.DECIDE, plan, "k", 1, 500, None)], 7)[1][1] == f"7,0,1,d,1,{tb(plan)},1,500,"
    lease_op: wire.Op = (wire.DECIDE, leases, "k", 1, None, "a,b%c")
    assert planner.plan([lease_op], 7)[1][1].endswith(",1,,a%2Cb%25c")  # as the general path escapes it
    assert planner.plan([Op.decide(gcra_one, "k", 1)], 7)[0] == planner.gcra_one_sql
    assert planner.plan([Op.decide(gcra_two, "k", 1)], 7)[0] == planner.decide_single_sql
    assert planner.plan([(wire.REFUND, plan, "k", 1, None, None)], 7)[0] == planner.decide_one_sql
    assert planner.plan([Op.decide(plan, "k", 1), Op.decide(plan, "k", 1)], 7)[0] == planner.decide_one_sql
    assert planner.plan([Op.decide(plan, "k", 1), Op.decide(plan, "j", 1)], 7)[0] == planner.decide_sql
    assert planner.decide_single_sql in planner.prepared  # the shells run it by name


def test_a_reply_reads_the_same_from_a_cursor_and_from_a_prepared_statement() -> None:
    """A cursor gives the decide function's bigint[] as a list, a prepared statement as text."""
    plan = Rule("w", ["5/s", "20/min"], "fixed_window").plan
    ops: list[Any] = [Op.decide(plan, "a", 1), (wire.REFUND, plan, "b", 1, None, None)]
    fields = [1, -1, 0, 0, 4, 19, 1_000_000, 60_000_000, 1]
    from_cursor = PLANNER.read(ops, (fields,))
    assert from_cursor == PLANNER.read(ops, ("{" + ",".join(map(str, fields)) + "}",))
    assert from_cursor == PLANNER.read(ops, (("{" + ",".join(map(str, fields)) + "}").encode(),))
    decision, refunded = from_cursor
    assert not isinstance(decision, bool) and decision.allowed and decision.remaining_each == (4, 19)
    assert refunded is True


def tb(plan: Any) -> str:
    """A plan's algorithm, limit count and spec fields as the request spells them."""
    return ",".join(map(str, [plan.algorithm.name, len(plan.specs), *(x for spec in plan.specs for x in spec)]))
