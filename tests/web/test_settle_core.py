"""``response_cost`` and ``usage()``: what a request really cost, settled once its response
ended (``ratekeeper.web.settle``), by the cores and by the ASGI middleware driven message
by message (the order of the response's messages is the point: no server in between)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request

from ratekeeper import Rule
from ratekeeper.config.model import HttpRule, KeyTemplate
from ratekeeper.errors import ConfigurationError, StoreError
from ratekeeper.limit import MAX_COUNT
from ratekeeper.limiter.limiter import Limiter
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.stores.url import open_store
from ratekeeper.testing import FakeClock
from ratekeeper.web import RateLimitMiddleware, RequestView, Usage, usage
from ratekeeper.web.core import RateLimitCore
from ratekeeper.web.settle import USAGE, settled_cost

from .watched import WatchedAsyncLimiter

PEER = "192.0.2.1"


def rule(name: str, limits: str = "100/minute", algorithm: str = "fixed_window", shadow: bool = False) -> HttpRule:
    return HttpRule(Rule(name, limits, algorithm), key=KeyTemplate.parse("{client_ip}"), shadow=shadow)


def used(limiter: Limiter, r: HttpRule, count: int = 100) -> int:
    """What ``PEER`` has used of a fixed window of ``count`` (``peek`` tells what one more would leave)."""
    return count - limiter.peek(r.rule, PEER).remaining - 1


def view(native: Any = None) -> RequestView:
    return RequestView(method="GET", path="/x", peer=PEER, native=native if native is not None else {})


def sync_core(rules: list[HttpRule], limiter: Limiter | None = None, **options: Any) -> RateLimitCore:
    return RateLimitCore(rules, limiter=limiter or Limiter("memory://", clock=FakeClock()), **options)


def settle(core: RateLimitCore, status: int, headers: list[tuple[str, str]], holder: Any = None) -> None:
    """One request through ``core``: checked, answered ``status`` with ``headers``, finished."""
    v = view(holder)
    verdict = core.check(v)
    assert verdict.allowed
    record = core.response_record(verdict, v, holder)
    if record is not None:
        record.started(status, headers)
    core.finish(verdict, status, record)


# -- Usage and usage() ------------------------------------------------------------------


def test_usage_adds_ints_and_refuses_anything_else() -> None:
    meter = Usage()
    assert (meter.total, meter.added) == (0, False)
    meter.add(0)
    assert (meter.total, meter.added) == (0, True)
    meter.add(3)
    meter.add(4)
    assert meter.total == 7
    for bad in (-1, 1.5, True, "2", None, 2**80 * -1):
        with pytest.raises(ValueError, match=r"int >= 0"):
            meter.add(bad)  # type: ignore[arg-type]
    assert meter.total == 7
    meter.add(2**80)  # beyond every limit: capped where the stores stop
    assert meter.total == MAX_COUNT


def test_usage_is_one_meter_per_request_whatever_the_app_holds() -> None:
    scope: dict[str, Any] = {"type": "http", "method": "GET", "path": "/", "headers": []}
    meter = usage(scope)
    assert usage(scope) is meter is scope[USAGE]
    assert usage(Request(scope)) is meter  # Starlette / FastAPI
    environ: dict[str, Any] = {"REQUEST_METHOD": "GET"}
    assert usage(SimpleNamespace(environ=environ)) is usage(environ)  # Flask / werkzeug
    meta: dict[str, Any] = {}
    django_asgi = SimpleNamespace(META=meta, scope={"type": "http"})  # Django's ASGIRequest has both
    assert usage(django_asgi) is meta[USAGE]
    with pytest.raises(TypeError, match="ASGI scope"):
        usage(object())


def test_response_cost_is_checked_when_the_core_is_built() -> None:
    for bad in ("x tokens", "", 5, {"r": 3}, {"": "x-cost"}, ["x-cost"]):
        with pytest.raises(ConfigurationError, match="response_cost"):
            sync_core([rule("r")], response_cost=bad)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0),
        ("17", 17),
        (" 17\t", 17),
        (str(MAX_COUNT), MAX_COUNT),
        (str(MAX_COUNT + 1), None),
        ("9" * 400, None),
        ("-5", None),
        ("+5", None),
        ("1e3", None),
        ("0x10", None),
        ("12abc", None),
        ("", None),
        ("\u0663", None),  # ARABIC-INDIC DIGIT THREE: isdigit() says yes
        ("\uff15", None),  # FULLWIDTH DIGIT FIVE
        ("\u00b2", None),  # SUPERSCRIPT TWO
        (7, 7),
        (-1, None),
        (True, None),
        (2.0, None),
        (MAX_COUNT + 1, None),
    ],
)
def test_a_real_cost_is_ascii_digits_or_an_int_up_to_the_stores_bound(value: object, expected: int | None) -> None:
    assert settled_cost(value) == expected


# -- the settlement, by the sync core ---------------------------------------------------


def test_a_header_charges_the_difference_or_refunds_it(rule_name: str) -> None:
    r = rule(rule_name)
    core = sync_core([r], response_cost="X-Tokens-Used")
    settle(core, 200, [("X-Tokens-Used", "40")])
    assert used(core.limiter, r) == 40
    settle(core, 200, [("x-tokens-used", "0")])  # charged 1, cost nothing: refunded
    assert used(core.limiter, r) == 40
    settle(core, 200, [("content-type", "text/plain")])  # no field, no meter: the charge stays
    assert used(core.limiter, r) == 41


def test_the_usage_total_is_the_cost_when_the_response_does_not_say(rule_name: str) -> None:
    r = rule(rule_name)
    core = sync_core([r], response_cost="x-tokens-used")
    environ: dict[str, Any] = {}
    usage(environ).add(12)
    settle(core, 200, [], environ)
    assert used(core.limiter, r) == 12
    environ = {}
    usage(environ).add(30)
    settle(core, 200, [("x-tokens-used", "5")], environ)  # the field wins over the meter
    assert used(core.limiter, r) == 17


def test_response_cost_true_settles_by_the_meter_alone(rule_name: str) -> None:
    r = rule(rule_name)
    core = sync_core([r], response_cost=True)
    environ: dict[str, Any] = {}
    usage(environ).add(12)
    settle(core, 200, [("x-tokens-used", "5")], environ)  # no header is read
    assert used(core.limiter, r) == 12
    settle(core, 200, [], {})  # the app metered nothing: the charge of 1 stays
    assert used(core.limiter, r) == 13


def test_settled_exactly_once(rule_name: str) -> None:
    r = rule(rule_name)
    core = sync_core([r], response_cost="x-cost")
    v = view()
    verdict = core.check(v)
    record = core.response_record(verdict, v, {})
    assert record is not None
    record.started(200, [("x-cost", "9")])
    core.finish(verdict, 200, record)
    core.finish(verdict, 200, record)
    core.finish(verdict, 500, record)
    assert used(core.limiter, r) == 9


def test_a_refund_by_status_wins_over_the_settlement(rule_name: str) -> None:
    r = rule(rule_name)
    core = sync_core([r], response_cost="x-cost", refund_statuses=range(500, 600))
    settle(core, 503, [("x-cost", "50")])
    assert used(core.limiter, r) == 0
    settle(core, 200, [("x-cost", "50")])
    assert used(core.limiter, r) == 50


def test_a_mapping_settles_only_its_rules_and_concurrency_rules_are_never_settled(rule_name: str) -> None:
    a, b = rule(rule_name + ".a"), rule(rule_name + ".b")
    slots = rule(rule_name + ".slots", "2/minute", "concurrency")
    limiter = Limiter("memory://", clock=FakeClock())
    core = sync_core([a, b, slots], limiter, response_cost={a.name: "x-cost", slots.name: "x-cost"})
    settle(core, 200, [("x-cost", "7")])
    assert (used(limiter, a), used(limiter, b)) == (7, 1)
    everyone = sync_core([a, b, slots], limiter, response_cost="x-cost")
    settle(everyone, 200, [("x-cost", "3")])
    assert (used(limiter, a), used(limiter, b)) == (10, 4)
    # the lease was released, nothing was charged to it: both slots are free
    assert limiter.peek(slots.rule, PEER, 2).allowed
    only_slots = sync_core([slots], limiter, response_cost="x-cost")
    v = view()
    assert only_slots.response_record(only_slots.check(v), v, {}) is None  # nothing to settle


def test_shadow_rules_are_settled_too(rule_name: str) -> None:
    enforced, shadow = rule(rule_name + ".e"), rule(rule_name + ".s", shadow=True)
    core = sync_core([enforced, shadow], response_cost="x-cost")
    settle(core, 200, [("x-cost", "6")])
    assert (used(core.limiter, enforced), used(core.limiter, shadow)) == (6, 6)


def test_the_callable_sees_the_response_and_its_none_falls_back_to_the_meter(rule_name: str) -> None:
    r = rule(rule_name)
    seen: list[tuple[str, int, dict[str, str]]] = []

    def cost(v: RequestView, status: int, headers: Mapping[str, str]) -> int | None:
        seen.append((v.path, status, dict(headers)))
        return int(headers["x-rows"]) * 2 if "x-rows" in headers else None

    core = sync_core([r], response_cost=cost)
    settle(core, 201, [("X-Rows", "4")])
    assert seen == [("/x", 201, {"x-rows": "4"})]
    assert used(core.limiter, r) == 8
    environ: dict[str, Any] = {}
    usage(environ).add(5)
    settle(core, 200, [], environ)
    assert used(core.limiter, r) == 13


@pytest.mark.parametrize("answer", [-1, True, "12", 2**60, 1.5])
def test_a_bad_answer_of_the_callable_keeps_the_charge(
    rule_name: str, answer: object, caplog: pytest.LogCaptureFixture
) -> None:
    r = rule(rule_name)
    core = sync_core([r], response_cost=lambda v, status, headers: answer)
    environ: dict[str, Any] = {}
    usage(environ).add(5)  # what the request cost when the callable's answer is not taken
    with caplog.at_level(logging.WARNING, "ratekeeper.web"):
        settle(core, 200, [], environ)
    assert used(core.limiter, r) == 5
    assert "response_cost's callable answered" in caplog.text


def test_a_callable_that_raises_keeps_the_charge(rule_name: str, caplog: pytest.LogCaptureFixture) -> None:
    r = rule(rule_name)

    def broken(v: RequestView, status: int, headers: Mapping[str, str]) -> int:
        raise KeyError("x-rows")

    core = sync_core([r], response_cost=broken)
    with caplog.at_level(logging.ERROR, "ratekeeper.web"):
        settle(core, 200, [])
    assert used(core.limiter, r) == 1
    assert "response_cost's callable raised" in caplog.text


HOSTILE = ["9" * 5000, str(MAX_COUNT + 1), "-100", "-0", "1e9", "12abc", "\u0663\u0663", "\uff15", "\u00b9", "0x7f", ""]


def test_hostile_header_values_never_error_nor_unlock(rule_name: str, caplog: pytest.LogCaptureFixture) -> None:
    r = rule(rule_name, "100/minute")
    header = "x-cost-" + rule_name.replace(".", "-")  # its own name: logged once per name
    core = sync_core([r], response_cost=header)
    with caplog.at_level(logging.WARNING, "ratekeeper.web"):
        for value in HOSTILE:
            settle(core, 200, [(header, value)])
    assert used(core.limiter, r) == len(HOSTILE)  # each request kept what it was charged
    warnings = [rec for rec in caplog.records if header in rec.getMessage()]
    assert len(warnings) == 1, "a bad value is logged once, not on every response"


class FailingLimiter(Limiter):
    """A limiter whose store takes decisions but fails the settlement."""

    def charge(self, rule: Rule, key: str, cost: int, *, now: int | None = None) -> Any:
        raise StoreError("the store went away")

    def refund(self, rule: Rule, key: str, cost: int = 1, *, lease_id: str | None = None) -> bool:
        raise StoreError("the store went away")


def test_a_store_error_while_settling_is_logged_and_counted_never_raised(
    rule_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    r = rule(rule_name)
    failed: list[str] = []
    metrics = SimpleNamespace(
        settle_failed=failed.append,
        shadow_rules=lambda names: None,
        skipped=lambda name: None,
        request=lambda transport: None,
        reloaded=lambda ok: None,
    )
    core = sync_core([r], FailingLimiter("memory://", clock=FakeClock()), response_cost="x-cost", metrics=metrics)
    with caplog.at_level(logging.WARNING, "ratekeeper.web"):
        settle(core, 200, [("x-cost", "30")])
        settle(core, 200, [("x-cost", "0")])
    assert failed == [r.name, r.name]
    assert "settling +29" in caplog.text and "settling -1" in caplog.text


# -- the ASGI middleware, message by message -----------------------------------------------

Message = dict[str, Any]


def scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "GET",
        "path": "/x",
        "raw_path": b"/x",
        "query_string": b"",
        "headers": [(b"host", b"api.example")],
        "client": (PEER, 5000),
        "server": ("api.example", 80),
    }


def memory_pair() -> tuple[AsyncLimiter, Limiter]:
    store = open_store("memory://", clock=FakeClock())
    return AsyncLimiter(store), Limiter(store)


async def receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def run(app: Any, on_send: Callable[[Message], None] | None = None) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)
        if on_send is not None:
            on_send(message)

    asyncio.run(app(scope(), receive, send))
    return sent


def test_trailers_are_read_and_the_response_is_settled_after_them_once(rule_name: str) -> None:
    r = rule(rule_name)
    alimiter, limiter = memory_pair()

    async def app(s: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-cost", b"3")], "trailers": True})
        await send({"type": "http.response.body", "body": b"abc", "more_body": False})
        await send({"type": "http.response.trailers", "headers": [(b"x-cost", b"7")], "more_trailers": False})
        raise RuntimeError("after the response: nothing to settle again")

    seen: list[int] = []
    middleware = RateLimitMiddleware(app, rules=[r], limiter=alimiter, response_cost="x-cost")
    with pytest.raises(RuntimeError):
        run(middleware, lambda message: seen.append(used(limiter, r)))
    assert seen == [1, 1, 1]  # settled after the trailers were sent, not before
    assert used(limiter, r) == 7


def test_settled_after_the_last_body_part_while_the_app_goes_on(rule_name: str) -> None:
    r = rule(rule_name)
    alimiter, limiter = memory_pair()
    after_body: list[int] = []

    async def app(s: Any, receive: Any, send: Any) -> None:
        meter = usage(s)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"ab", b"cd"):
            meter.add(len(part))
            await send({"type": "http.response.body", "body": part, "more_body": True})
        meter.add(1)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        after_body.append(used(limiter, r))  # the app still runs: already settled
        meter.add(100)  # too late: the response ended

    run(RateLimitMiddleware(app, rules=[r], limiter=alimiter, response_cost="x-cost"))
    assert after_body == [5]
    assert used(limiter, r) == 5


def test_an_app_that_raises_is_settled_with_what_it_added(rule_name: str) -> None:
    r = rule(rule_name)
    alimiter, limiter = memory_pair()

    async def app(s: Any, receive: Any, send: Any) -> None:
        usage(s).add(4)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        run(RateLimitMiddleware(app, rules=[r], limiter=alimiter, response_cost="x-cost"))
    assert used(limiter, r) == 4


def test_a_cancelled_app_is_settled_with_what_it_streamed(rule_name: str) -> None:
    r = rule(rule_name)
    alimiter, limiter = memory_pair()

    async def main() -> None:
        streaming = asyncio.Event()

        async def app(s: Any, receive: Any, send: Any) -> None:
            meter = usage(s)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            meter.add(6)
            await send({"type": "http.response.body", "body": b"x" * 6, "more_body": True})
            streaming.set()
            await asyncio.Event().wait()  # the client is gone before the rest

        async def send(message: Message) -> None:
            pass

        middleware = RateLimitMiddleware(app, rules=[r], limiter=alimiter, response_cost="x-cost")
        task = asyncio.create_task(middleware(scope(), receive, send))
        await streaming.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert used(limiter, r) == 6


def test_a_request_no_rule_limited_gets_a_meter_that_is_never_settled(rule_name: str) -> None:
    r = HttpRule(Rule(rule_name, "100/minute", "fixed_window"), key=KeyTemplate.parse("{header.x-api-key}"))
    alimiter = WatchedAsyncLimiter(open_store("memory://", clock=FakeClock()))
    meters: list[Usage] = []

    async def app(s: Any, receive: Any, send: Any) -> None:
        meter = usage(s)
        meter.add(50)
        meters.append(meter)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent = run(RateLimitMiddleware(app, rules=[r], limiter=alimiter, response_cost="x-cost"))
    assert sent[0]["status"] == 200 and meters[0].total == 50
    assert not alimiter.settled.acquire(blocking=False)  # nothing charged or refunded after the response
