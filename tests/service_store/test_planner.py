"""The service store's planner without I/O: what ``plan`` writes is what the service's end
(``protocol.read_call``) reads, and ``read`` turns the service's replies and failures into
results; httpx's exceptions become ours (``errors``)."""

from __future__ import annotations

import json

import httpx
import pytest

from ratekeeper import Rule
from ratekeeper.decision import Decision
from ratekeeper.errors import StoreError, StoreTimeout
from ratekeeper.op import Op
from ratekeeper.stores.memory import MemoryStore
from ratekeeper.stores.service.errors import reason, store_down, unreachable
from ratekeeper.stores.service.planner import ServicePlanner
from ratekeeper.stores.service.protocol import PlanCache, encode_results, read_call, reset_op

NOW = 1_763_870_000_000_000
USER = Rule("user", ["2/minute"]).plan
IP = Rule("ip", ["5/minute", "50/hour"], "fixed_window").plan


def test_the_service_reads_what_the_planner_writes() -> None:
    ops = [Op.decide(USER, "u1", 1), Op.peek(IP, "10.0.0.1", 2), Op.decide(USER, "u2", 1, 5_000_000)]
    got, now, atomic = read_call(json.loads(ServicePlanner.plan(ops, NOW)), PlanCache())
    assert (now, atomic) == (NOW, False)
    assert [(o[0], o[2], o[3], o[4], o[5]) for o in got] == [(o[0], o[2], o[3], o[4], o[5]) for o in ops]
    assert [o[1].name for o in got] == ["store-api:user", "store-api:ip", "store-api:user"]
    assert got[0][1] is got[2][1]  # one rule a call, however many of its ops
    assert [x.count for x in got[1][1].limits] == [x.count for x in IP.limits]


def test_an_atomic_call_says_so() -> None:
    ops = [Op.decide(USER, "u1", 1), Op.decide(IP, "10.0.0.1", 1)]
    assert read_call(json.loads(ServicePlanner.plan(ops, None, atomic=True)), PlanCache())[1:] == (None, True)


def test_a_reset_travels_as_its_own_mode() -> None:
    (got,), now, atomic = read_call(json.loads(ServicePlanner.plan([reset_op(USER, "k")], None)), PlanCache())
    assert (got[0], got[2], now, atomic) == ("x", "k", None, False)


def test_the_planner_reads_the_decisions_the_service_made() -> None:
    ops = [Op.decide(USER, "k", 1), Op.decide(USER, "k", 1), Op.decide(USER, "k", 1), Op.refund(USER, "k", 1)]
    served, _, _ = read_call(json.loads(ServicePlanner.plan(ops, NOW)), PlanCache())
    memory = MemoryStore()
    results: list[Decision | BaseException | None] = [memory.decide(o, NOW) for o in served[:3]]
    results.append(memory.refund(served[3], NOW))
    body = json.dumps({"results": encode_results(results)}).encode()
    read = ServicePlanner.read(ops, 200, body)
    assert [d.allowed for d in read[:3] if isinstance(d, Decision)] == [True, True, False]
    assert read[3] is True
    for mine, theirs in zip(read[:3], results[:3], strict=True):
        assert isinstance(mine, Decision) and isinstance(theirs, Decision)
        assert (mine.rule, mine[2:9]) == (USER.name, theirs[2:9])  # the client's rule, the service's decision


def test_an_op_the_services_store_failed_is_its_own_result() -> None:
    ops = [Op.decide(USER, "a", 1), Op.decide(USER, "b", 1)]
    body = json.dumps({"results": [{"error": "boom", "timeout": True}, {"error": "bang", "timeout": False}]})
    first, second = ServicePlanner.read(ops, 200, body.encode())
    assert isinstance(first, StoreTimeout) and "boom" in str(first)
    assert isinstance(second, StoreError) and not isinstance(second, StoreTimeout)


@pytest.mark.parametrize(
    ("status", "body", "error", "says"),
    [
        (504, b'{"detail": "slow"}', StoreTimeout, "slow"),
        (401, b'{"detail": "no token"}', StoreError, "token_file"),
        (503, b"down", StoreError, "503: down"),
        (200, b'{"results": []}', StoreError, "0 results for 1 ops"),
    ],
)
def test_a_reply_that_is_no_answer_raises(status: int, body: bytes, error: type[StoreError], says: str) -> None:
    with pytest.raises(error, match=says):
        ServicePlanner.read([Op.decide(USER, "k", 1)], status, body)


def test_httpx_failures_become_ours_and_say_whether_the_service_is_down() -> None:
    def raised(exc: httpx.HTTPError) -> StoreError:
        try:
            raise unreachable(exc, "http://svc", 1.0, "a decision") from reason(exc)
        except StoreError as error:
            return error

    timeout = raised(httpx.ReadTimeout("late"))
    assert isinstance(timeout, StoreTimeout) and store_down(timeout)
    refused = raised(httpx.ConnectError("refused"))
    assert type(refused) is StoreError and isinstance(refused.__cause__, OSError) and store_down(refused)
    assert not store_down(StoreError("the ratekeeper service answered 400: bad"))
