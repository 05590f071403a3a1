"""What the tests send and what they expect of a limited response (docs/web.md, "What a client sees")."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx

__all__ = ["HOSTILE", "MONITOR", "OPTIONS", "assert_denied", "assert_limited_headers", "burst", "common_rules"]


OPTIONS: dict[str, Any] = {
    "exempt_paths": ["/exempt/*"],
    "refund_statuses": list(range(500, 600)),
    "trusted_proxies": ["127.0.0.1"],
}
"""Middleware options every test server gets."""

MONITOR = "203.0.113.50"
"""The monitoring address the ``ip`` rule of ``HOSTILE`` exempts."""

HOSTILE: dict[str, Any] = {
    "store": "memory://",
    "rules": [
        {"name": "long", "path": "/header", "key": "{header.authorization}", "limits": ["2/minute"]},
        {"name": "cost", "path": "/items/{user}", "key": "{path.user}", "cost": "{header.x-cost}"}
        | {"limits": ["3/minute"]},
        {"name": "ip", "path": "/ip", "key": "{client_ip}", "limits": ["1/minute"]},
        {"name": "tenant", "path": "/ip", "key": "{header.x-tenant}", "limits": ["1/minute"]},
    ],
    "options": {
        # Every loopback address is a proxy here: the tests' proxies each connect from one of their own.
        "trusted_proxies": ["127.0.0.0/8"],
        "forwarded_header": "forwarded",
        "exempt_keys": {"ip": [MONITOR], "{header.x-probe}": ["probe-secret"]},
        "deny_response": "bytes",
    },
}
"""The configuration of ``hostile_server``: rules keyed by what a client controls."""

KEY = "{path.user}"
PARTNER = ["1/3s"]
"""The partner scenario's limit (USERS.md 1)."""


def common_rules(suffix: str = "", *, router: bool = True) -> list[dict[str, Any]]:
    """The rules every test app runs (names end with ``suffix``: unique per shared store).
    Without a ``router`` (the plain WSGI middleware) the ``{route}`` rule is left out: it
    is refused there at start (tests/web/test_unkeyable_web.py)."""
    rules = [
        *(
            {"name": f"{v}{suffix}", "methods": ["GET"], "path": f"/{v}/{{user}}", "key": KEY, "limits": PARTNER}
            for v in ("items", "aitems")
        ),
        {"name": f"fail{suffix}", "path": "/fail/{code}", "key": "{query.k}", "limits": ["1/minute"]},
        {"name": f"boom{suffix}", "path": "/boom", "key": "{query.k}", "limits": ["5/minute"]},
        {"name": f"header{suffix}", "path": "/header", "key": "{header.x-api-key}", "limits": ["1/minute"]},
        {"name": f"exempt{suffix}", "path": "/exempt/*", "limits": ["1/minute"]},
        {"name": f"stream{suffix}", "path": "/stream/{n}", "key": "{query.k}", "limits": ["10/minute"]},
        {"name": f"me{suffix}", "path": "/me", "key": "{user}", "limits": ["1/minute"]},
        {"name": f"ame{suffix}", "path": "/ame", "key": "{user}", "limits": ["1/minute"]},
        {"name": f"route{suffix}", "path": "/r/{x}", "key": "{route}", "limits": ["1/minute"]},
        {"name": f"ip{suffix}", "path": "/ip", "key": "{client_ip}", "limits": ["1/minute"]},
        {"name": f"kw{suffix}", "path": "/kw/*", "key": "{path.user}", "limits": ["1/minute"]},
    ]
    return rules if router else [r for r in rules if r.get("key") != "{route}"]


async def _burst(url: str, n: int, headers: dict[str, str] | None) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=20.0) as client:
        return list(await asyncio.gather(*(client.get(url, headers=headers) for _ in range(n))))


def burst(url: str, n: int = 10, headers: dict[str, str] | None = None) -> list[httpx.Response]:
    """``n`` concurrent GETs of ``url``, each on its own connection."""
    return asyncio.run(_burst(url, n, headers))


def assert_limited_headers(response: httpx.Response, rule: str, limit: int, window: int, remaining: int) -> None:
    """The draft-11 fields and the X-RateLimit-* family for one rule."""
    policy = response.headers.get("RateLimit-Policy", "")
    assert f'"{rule}";q={limit};w={window}' in policy, policy
    ratelimit = response.headers.get("RateLimit", "")
    assert ratelimit.startswith(f'"{rule}";r={remaining};t='), ratelimit
    assert response.headers["X-RateLimit-Limit"] == str(limit)
    assert response.headers["X-RateLimit-Remaining"] == str(remaining)
    assert 0 <= float(response.headers["X-RateLimit-Reset"]) <= window


def assert_denied(response: httpx.Response, rule: str, limit: int, window: int) -> None:
    """A 429 with ``Retry-After``, the rate-limit headers and a problem+json body."""
    assert response.status_code == 429, response.text
    retry_after = int(response.headers["Retry-After"])
    assert 1 <= retry_after <= window
    assert response.headers["Content-Type"].startswith("application/problem+json")
    body = response.json()
    assert body["type"].endswith("quota-exceeded"), body
    assert body["status"] == 429
    assert body["rule"] == rule
    assert 0 < body["retry_after"] <= window
    assert math.ceil(body["retry_after"]) == retry_after
    assert body["violated-policies"] == [rule], body
    assert_limited_headers(response, rule, limit, window, remaining=0)
