"""The small app the built-in scenario loads: Starlette behind ``RateLimitMiddleware``,
one rule whose per-account limits come from a quota provider (a stand-in for a billing
system), one rule for anonymous traffic by client address, and the admin account exempt
from both (the control). Served by uvicorn: ``uvicorn --factory
ratekeeper.loadtest.app:create_app``."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratekeeper.config.model import HttpRule, Match
from ratekeeper.quota import Quota, QuotaAnswer
from ratekeeper.rule import Rule
from ratekeeper.web import RateLimitMiddleware
from ratekeeper.web.core import RequestView

__all__ = [
    "ACCOUNTS",
    "ACCOUNT_HEADER",
    "ADMIN",
    "ANONYMOUS_LIMIT",
    "FAILSAFE",
    "QUOTA_MAX_KEYS",
    "account_limits",
    "create_app",
]

ACCOUNT_HEADER = "x-account-id"
ACCOUNTS = {"alice@example.com": "1/minute", "bob@example.com": "10/s", "carol@example.com": "100/s"}
"""What the "billing system" knows: each account's plan."""
ADMIN = "admin@example.com"
FAILSAFE = "5/s"
"""The accounts rule's own limit: what an account gets until (or unless) the provider answers."""
QUOTA_MAX_KEYS = 1000
ANONYMOUS_LIMIT = "20/s"
"""Requests without an account, per client address."""


def account_limits(account: str) -> QuotaAnswer:
    """The provider: a known account's plan; an unknown one gets the failsafe (answered
    rather than raised, so a flood of unknown ids does not fill the log with errors)."""
    return ACCOUNTS.get(account, FAILSAFE)


async def _ok(request: Request) -> Response:
    return PlainTextResponse("ok")


def _key(view: RequestView, rule: HttpRule) -> str | None:
    # Each request meets exactly one rule: its account's, or the anonymous one.
    account = view.header(ACCOUNT_HEADER)
    if rule.name == "accounts":
        return account
    return view.peer or "unknown" if account is None else None


def create_app() -> Starlette:
    # At most 1,000 accounts' answers are kept: the flood of unknown ids fills the cache in
    # a few seconds, after which the server's memory must stay flat. The real accounts,
    # asked for many times a second, are the most recently used and stay.
    quota = Quota(account_limits, ttl=300, max_keys=QUOTA_MAX_KEYS)
    accounts = Rule("accounts", [FAILSAFE], quota=quota)
    # Known accounts are looked up before the first request, so their first second is
    # decided by their own plan rather than by the failsafe.
    for account in ACCOUNTS:
        quota.plan_for(account, accounts)
    quota.wait_idle()
    rules = [HttpRule(accounts, Match()), HttpRule(Rule("anonymous", [ANONYMOUS_LIMIT]), Match())]
    middleware = Middleware(
        RateLimitMiddleware,
        rules=rules,
        key=_key,
        exempt_keys={f"{{header.{ACCOUNT_HEADER}}}": [ADMIN]},
    )
    return Starlette(routes=[Route("/", _ok)], middleware=[middleware])
