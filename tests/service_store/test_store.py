"""The ratekeeper service as a store (``Limiter("http://host:port")``), against a real
``ratekeeper serve`` process: the same decisions as any store (the conformance suite runs
it too), coalesced calls, all-or-nothing batches, and the failure policy when the
service is gone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import httpx
import pytest

from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.errors import ConfigurationError, StoreError
from ratekeeper.op import Op
from servers import RatekeeperService


@pytest.fixture(scope="module")
def service() -> Iterator[RatekeeperService]:
    served = RatekeeperService("memory://")
    yield served
    served.close()


@pytest.fixture
def name() -> str:
    return f"svc-{uuid.uuid4().hex[:8]}"


def test_the_partner_rule_admits_one_of_ten_concurrent_calls(service: RatekeeperService, name: str) -> None:
    async def main() -> list[bool]:
        async with AsyncLimiter(service.admin_url) as limiter:
            rule = Rule(name, ["1/3s"])
            decisions = await asyncio.gather(*(limiter.try_acquire(rule, "partner-7") for _ in range(10)))
            assert all(0 < d.retry_after <= 3.0 for d in decisions if not d.allowed)
            return [d.allowed for d in decisions]

    assert 1 == sum(asyncio.run(main()))


def test_concurrent_calls_on_one_key_coalesce_into_few_requests(service: RatekeeperService, name: str) -> None:
    """100 tasks on one key: far fewer HTTP requests than calls, and exactly the limit admitted."""

    async def main() -> tuple[int, int]:
        async with AsyncLimiter(service.admin_url) as limiter:
            rule = Rule(name, ["40/minute"], algorithm="token_bucket")
            decisions = await asyncio.gather(*(limiter.try_acquire(rule, "hot") for _ in range(100)))
            return sum(d.allowed for d in decisions), limiter.store.shell.calls  # type: ignore[attr-defined]

    admitted, requests = asyncio.run(main())
    assert 40 == admitted
    assert requests <= 20


def test_a_batch_is_all_or_nothing_and_the_limits_travel_with_the_call(service: RatekeeperService, name: str) -> None:
    with Limiter(service.admin_url) as limiter:
        per_user = Rule(f"{name}.user", ["5/minute"])
        global_ = Rule(f"{name}.global", ["2/minute"], algorithm="fixed_window")
        assert limiter.try_acquire_many([(per_user, "u1", 1), (global_, "*", 2)])
        refused = limiter.try_acquire_many([(per_user, "u1", 1), (global_, "*", 1)])
        assert not refused
        assert 4 == limiter.peek(per_user, "u1", 0).remaining  # the refusal charged nothing
        limiter.refund(per_user, "u1", 1)
        assert 5 == limiter.peek(per_user, "u1", 0).remaining
        limiter.reset(global_, "*")
        assert 2 == limiter.peek(global_, "*", 0).remaining


def test_a_service_that_is_gone_follows_the_failure_policy(name: str) -> None:
    served = RatekeeperService("memory://")
    limiter = Limiter(served.admin_url, on_error="allow", timeout=0.5)
    rule = Rule(name, ["1/minute"])
    try:
        assert limiter.try_acquire(rule, "k")
        served.close()
        decision = limiter.try_acquire(rule, "k")
        assert decision.allowed and "allow" == decision.fallback
        with pytest.raises(StoreError, match="unreachable"):
            Limiter(served.admin_url).try_acquire(rule, "k")
    finally:
        limiter.close()


def test_the_service_refuses_an_explicit_now_unless_started_for_tests(service: RatekeeperService, name: str) -> None:
    """One client may not move a key's state in time for every other."""
    from ratekeeper.stores.service.store import ServiceStore

    store = ServiceStore(service.admin_url)
    try:
        with pytest.raises(StoreError, match="may not carry 'now'"):
            store.decide(Op.decide(Rule(name, ["1/s"]).plan, "k", 1), 1_000_000)
    finally:
        store.close()


def test_malformed_store_calls_are_4xx_problems_and_decide_nothing(service: RatekeeperService) -> None:
    bad = [
        {"ops": []},
        {"rules": [["r", "nope", [[1, 1_000_000, None]]]], "ops": [["d", 0, "k", 1, None, None]]},
        {"rules": [["r", "gcra", [[1, 1_000_000, None]]]], "ops": [["d", 1, "k", 1, None, None]]},
        {"rules": [["r", "gcra", [[1, 1_000_000, None]]]], "ops": [["d", 0, "", 1, None, None]]},
        {"rules": [["r", "gcra", [[1, 1_000_000, None]]]], "ops": [["d", 0, "k", -1, None, None]]},
        {"rules": [["r", "gcra", [[0, 1_000_000, None]]]], "ops": [["d", 0, "k", 1, None, None]]},
    ]
    for body in bad:
        response = httpx.post(f"{service.admin_url}/v1/store", json=body)
        assert 400 == response.status_code, body
        assert "application/problem+json" == response.headers["content-type"]
        assert response.json()["detail"]


def test_store_options_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="accepted"):
        Limiter("http://127.0.0.1:1/?pool=3")
    with pytest.raises(ConfigurationError, match="max_in_flight"):
        Limiter("http://127.0.0.1:1/", max_in_flight=0)


def test_a_rule_spec_of_the_wrong_shape_is_a_400_not_a_crash(service: RatekeeperService) -> None:
    """Found by schemathesis: a limit given as an object made the plan cache raise TypeError."""
    body = {"now": None, "ops": [["d", 0, "k", 0, 0, None]], "rules": [["r", "gcra", [{}]]]}
    response = httpx.post(f"{service.admin_url}/v1/store", json=body)
    assert 400 == response.status_code
    problem = response.json()
    assert "rules[0][2] (limits)[0] must be an array, got object" == problem["detail"]
    assert "[count, period_us, burst | null]" in problem["accepted"]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["threads", "asyncio"])
def test_an_op_no_store_decides_exactly_is_refused_at_the_client_and_never_sent(
    service: RatekeeperService, asynchronous: bool
) -> None:
    """The service store checks each op at its entry, as every store does: the hostile op
    is an InvalidRequest of its own (not a StoreError from the service's 400), and no
    request leaves the process for it."""
    from ratekeeper.errors import InvalidRequest
    from ratekeeper.stores.service.store import ServiceStore
    from ratekeeper.stores.service.store_async import AsyncServiceStore
    from stores.test_op_isolation import _hostile

    for label, op in _hostile(f"svc{uuid.uuid4().hex[:6]}").items():
        if asynchronous:

            async def attempt(op: Op = op) -> int:
                store = AsyncServiceStore(service.admin_url)
                try:
                    with pytest.raises(InvalidRequest):
                        await (store.refund(op) if op[0] == "r" else store.decide(op))
                    return store.shell.calls
                finally:
                    await store.aclose()

            calls = asyncio.run(attempt())
        else:
            sync = ServiceStore(service.admin_url)
            try:
                with pytest.raises(InvalidRequest):
                    sync.refund(op) if op[0] == "r" else sync.decide(op)
                calls = sync.shell.calls
            finally:
                sync.close()
        assert 0 == calls, label
