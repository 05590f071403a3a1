"""``{user|client_ip}`` under a real uvicorn: a logged-in user is keyed by user, an
anonymous one by address."""

from __future__ import annotations

import httpx
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, BaseUser, SimpleUser
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratekeeper.web import RateLimitMiddleware

from .conftest import http_rule
from .uvicorn_server import serve


class BearerName(AuthenticationBackend):
    """``Authorization: Bearer <name>`` logs ``<name>`` in; no header, no user."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        scheme, _, name = conn.headers.get("authorization", "").partition(" ")
        if scheme != "Bearer" or not name:
            return None
        return AuthCredentials(["authenticated"]), SimpleUser(name)


async def home(request: Request) -> Response:
    return PlainTextResponse("ok")


def test_a_user_is_keyed_by_user_and_an_anonymous_client_by_address(rule_name: str) -> None:
    rule = http_rule(rule_name, "1/minute", key="{user|client_ip}")
    app = Starlette(routes=[Route("/", home)])
    # added first, so it runs inside the authentication middleware and sees scope["user"]
    app.add_middleware(RateLimitMiddleware, rules=[rule], trusted_proxies=["127.0.0.1"])
    app.add_middleware(AuthenticationMiddleware, backend=BearerName())
    a, b = {"X-Forwarded-For": "203.0.113.1"}, {"X-Forwarded-For": "203.0.113.2"}
    alice = {"Authorization": "Bearer alice"}
    sequence = [
        a,  # anonymous at address a
        a,  # the same address again: refused
        b,  # another address: its own key
        {**alice, **a},  # alice from address a: keyed by alice, not by a
        {**alice, **b},  # alice from another address: the same key, refused
        {"Authorization": "Bearer bob", **a},  # bob: his own key
    ]
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        got = [client.get("/", headers=headers).status_code for headers in sequence]
    assert [200, 429, 200, 200, 429, 200] == got
