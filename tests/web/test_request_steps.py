"""What the core works out once per rule (its ``_Step``) and the shortcut of a request of
one enforced rule decide as the general path does: the same verdicts, headers and
charges, on cores that differ only in the path they take."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ratekeeper import AsyncLimiter, Rule
from ratekeeper.limiter.drive_async import drive
from ratekeeper.testing import FakeClock
from ratekeeper.web.core_async import AsyncRateLimitCore
from ratekeeper.web.problem import problem, problem_body
from ratekeeper.web.request import RequestView, Verdict

from .conftest import http_rule


def _pair(rules: list[Any], **options: Any) -> tuple[AsyncRateLimitCore, AsyncRateLimitCore]:
    """Two cores on two stores whose clocks stand still at the same time."""
    return tuple(  # type: ignore[return-value]
        AsyncRateLimitCore(rules, limiter=AsyncLimiter("memory://", clock=FakeClock()), **options) for _ in range(2)
    )


async def _general(core: AsyncRateLimitCore, view: RequestView) -> Verdict:
    """The verdict by the transaction, as a request of several rules gets it."""
    return await drive(core.limiter, core.check_flow(view))


def _same(a: Verdict, b: Verdict) -> None:
    assert (a.allowed, a.status, a.headers, a.body, a.skipped) == (b.allowed, b.status, b.headers, b.body, b.skipped)
    assert [(c.rule.name, c.key, c.cost) for c in a.charges] == [(c.rule.name, c.key, c.cost) for c in b.charges]


def _view(peer: str | None = "192.0.2.1", path: str = "/items/a", **fields: Any) -> RequestView:
    return RequestView("GET", path, peer=peer, **fields)


def test_one_rule_decides_as_its_transaction_allowed_and_refused() -> None:
    async def run() -> None:
        short, general = _pair([http_rule("one", "2/minute", key="{client_ip}")])
        for _ in range(4):
            _same(await short.check(_view()), await _general(general, _view()))

    asyncio.run(run())


def test_the_steps_keep_what_depends_on_the_request() -> None:
    """A match, a cost read from a header, a key the request lacks, an exempt key, a shadow
    rule: each decided per request as the general path decides it."""
    rules = [
        http_rule("by_path", "3/minute", path="/items/{user}", key="{path.user}"),
        http_rule("by_cost", "10/minute", key="{client_ip}", cost="{header.x-cost}"),
        http_rule("by_header", "5/minute", key="{header.x-key}"),
        http_rule("watched", "1/minute", key="{client_ip}", shadow=True),
    ]

    async def run() -> None:
        short, general = _pair(rules, exempt_keys={"by_path": ["vip"]})
        views = [
            _view(headers={"x-cost": "4"}),
            _view(path="/items/vip", headers={"x-key": "k"}),
            _view(path="/other", headers={"x-cost": "nope"}),
            _view(peer=None),
            _view(headers={"x-cost": "4", "x-key": "k"}),
        ]
        for view in views * 2:
            _same(await short.check(view), await _general(general, view))

    asyncio.run(run())


def test_only_the_client_address_as_key_and_no_address_skips_the_rule() -> None:
    async def run() -> None:
        short, general = _pair([http_rule("ip", "1/minute", key="{client_ip}")])
        for peer in (None, "", "192.0.2.9"):
            _same(await short.check(_view(peer=peer)), await _general(general, _view(peer=peer)))

    asyncio.run(run())


def test_a_refusals_body_is_its_problem_document_every_time() -> None:
    async def run() -> None:
        limiter = AsyncLimiter("memory://", clock=FakeClock())
        rule = Rule("r", ["1/minute", "5/hour"])
        await limiter.try_acquire(rule, "k")
        refused = await limiter.try_acquire(rule, "k")
        for retry in (59, 59, None):
            body = problem_body([refused], retry)
            assert json.loads(body) == problem([refused], retry)
            assert body == problem_body([refused], retry)

    asyncio.run(run())
