"""Rules whose key an integration can never build are refused at start; those it may not
build are warned once per rule. Through the real integrations: the WSGI middleware (in
process and under gunicorn), Django (gunicorn), Starlette under uvicorn."""

from __future__ import annotations

import logging
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, BaseUser, SimpleUser
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratekeeper.errors import ConfigurationError
from ratekeeper.web import RateLimitMiddleware
from ratekeeper.web.wsgi import WSGIRateLimitMiddleware
from web.wsgi.appserver import AppServer

from .conftest import http_rule
from .uvicorn_server import serve

FLASK = "web.wsgi.flask_app:app"  # Flask behind the plain WSGI middleware
DJANGO = "web.wsgi.django_project.django_wsgi:application"


def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def fresh() -> str:
    return uuid.uuid4().hex[:8]


# -- WSGI: {route} can never be keyed --------------------------------------------------------


def test_wsgi_refuses_a_route_keyed_rule_at_start_and_says_what_to_do() -> None:
    with pytest.raises(ConfigurationError) as err:
        WSGIRateLimitMiddleware(wsgi_app, rules=[http_rule("per_route", "1/minute", key="{route}")])
    text = str(err.value)
    assert "rule 'per_route': its key '{route}' needs {route}, which the WSGI middleware can never provide" in text
    assert "'{route|client_ip}'" in text and "ratekeeper.web.flask.RateLimiter" in text


def test_wsgi_refuses_it_under_gunicorn_the_worker_never_serves(tmp_path: Path) -> None:
    rules = [{"name": "per_route", "key": "{route}", "limits": ["1/minute"]}]
    with pytest.raises(RuntimeError) as err, AppServer(FLASK, {"store": "memory://", "rules": rules}, tmp_path):
        pass
    assert "ConfigurationError" in str(err.value)
    assert "needs {route}, which the WSGI middleware can never provide" in str(err.value)


def test_a_fallback_that_covers_the_route_passes_and_limits(tmp_path: Path) -> None:
    rules = [{"name": f"r.{fresh()}", "path": "/r/{x}", "key": "{route|client_ip}", "limits": ["1/minute"]}]
    with AppServer(FLASK, {"store": "memory://", "rules": rules}, tmp_path) as server:
        # no route under WSGI: keyed by the address, so two paths share the client's budget
        assert [httpx.get(f"{server.url}/r/{p}").status_code for p in ("a", "b")] == [200, 429]


def test_a_key_callable_turns_the_check_off() -> None:
    rule = http_rule("per_route", "1/minute", key="{route}")
    middleware = WSGIRateLimitMiddleware(wsgi_app, rules=[rule], key=lambda view, r: view.path)
    assert middleware.core.rules.rules == (rule,)


def test_a_cost_template_that_can_never_be_read_is_refused_at_start_too() -> None:
    with pytest.raises(ConfigurationError) as err:
        WSGIRateLimitMiddleware(wsgi_app, rules=[http_rule("priced", "10/minute", cost="{route}")])
    assert (
        "rule 'priced': its cost '{route}' needs {route}, which the WSGI middleware can never provide "
        "(it has no router to ask which route matched), so every request would be charged 1"
    ) in str(err.value)
    # a key= callable builds the keys, not the costs: the cost is still checked
    with pytest.raises(ConfigurationError, match=re.escape("its cost '{route}' needs")):
        WSGIRateLimitMiddleware(
            wsgi_app, rules=[http_rule("priced", "10/minute", cost="{route}")], key=lambda view, r: view.path
        )


def test_the_cost_option_is_checked_in_place_of_the_rules_cost() -> None:
    with pytest.raises(ConfigurationError, match=re.escape("rule 'plain': its cost '{route}' needs {route}")):
        WSGIRateLimitMiddleware(wsgi_app, rules=[http_rule("plain", "10/minute")], cost="{route}")
    with pytest.raises(ConfigurationError, match=re.escape("rule 'named': its cost '{route}'")):
        WSGIRateLimitMiddleware(wsgi_app, rules=[http_rule("named", "10/minute")], cost={"named": "{route}"})
    # the option replaces the rule's unreadable cost: a constant, or a callable of the rule
    # that decides every request, leaves nothing to refuse
    rule = http_rule("priced", "10/minute", cost="{route}")
    assert WSGIRateLimitMiddleware(wsgi_app, rules=[rule], cost=3).core.rules.rules == (rule,)
    assert WSGIRateLimitMiddleware(wsgi_app, rules=[rule], cost={"priced": lambda view: 2}).core.rules.rules == (rule,)


def test_a_cost_read_from_the_user_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "ratekeeper.web"):
        WSGIRateLimitMiddleware(wsgi_app, rules=[http_rule("priced", "10/minute", cost="{user}")])
    (record,) = caplog.records
    assert "its cost '{user}' needs {user}, which the WSGI middleware may not provide" in record.message
    assert "so a request without it is charged 1" in record.message


def test_an_exempt_keys_template_that_can_never_be_filled_is_refused_and_a_maybe_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rule = http_rule("per_ip", "10/minute")
    with pytest.raises(ConfigurationError) as err:
        WSGIRateLimitMiddleware(wsgi_app, rules=[rule], exempt_keys={"{route}": ["/health"]})
    assert (
        "exempt_keys: the template '{route}' needs {route}, which the WSGI middleware can never provide "
        "(it has no router to ask which route matched), so it would exempt no request"
    ) in str(err.value)
    with caplog.at_level(logging.WARNING, "ratekeeper.web"):
        WSGIRateLimitMiddleware(wsgi_app, rules=[rule], exempt_keys={"{user}": ["monitor"]})
    (record,) = caplog.records
    assert (
        "exempt_keys: the template '{user}' needs {user}, which the WSGI middleware may not provide" in record.message
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, "ratekeeper.web"):  # a user= callable provides it
        WSGIRateLimitMiddleware(wsgi_app, rules=[rule], exempt_keys={"{user}": ["monitor"]}, user=lambda view: "u")
    assert caplog.records == []


# -- WSGI: {user} may be missing (REMOTE_USER) ------------------------------------------------


def test_wsgi_warns_once_for_a_user_keyed_rule(caplog: pytest.LogCaptureFixture) -> None:
    rules = [http_rule("me", "1/minute", key="{user}"), http_rule("either", "1/minute", key="{user|client_ip}")]
    with caplog.at_level(logging.WARNING, "ratekeeper.web"):
        middleware = WSGIRateLimitMiddleware(wsgi_app, rules=rules)
        middleware.core.rules  # noqa: B018 - the rules in force, read again: no second warning
    (record,) = caplog.records
    assert "rule 'me': its key '{user}' needs {user}, which the WSGI middleware may not provide" in record.message
    assert "give a user= callable" in record.message


def test_a_user_callable_provides_the_user(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "ratekeeper.web"):
        WSGIRateLimitMiddleware(wsgi_app, rules=[http_rule("me", "1/minute", key="{user}")], user=lambda view: "u")
    assert caplog.records == []


# -- Django: {user} from the middleware before ratekeeper's -----------------------------------


def test_django_with_nothing_before_ratekeeper_refuses_a_user_rule(tmp_path: Path) -> None:
    rules = [{"name": "me", "path": "/me", "key": "{user}", "limits": ["1/minute"]}]
    env = {"DJANGO_SETTINGS_MODULE": "web.wsgi.django_project.django_bare_settings"}
    with (
        pytest.raises(RuntimeError) as err,
        AppServer(DJANGO, {"store": "memory://", "rules": rules}, tmp_path, env=env),
    ):
        pass
    text = str(err.value)
    assert "rule 'me': its key '{user}' needs {user}, which the Django middleware can never provide" in text
    assert "put django.contrib.auth.middleware.AuthenticationMiddleware before" in text


def test_django_with_another_middleware_first_only_warns(tmp_path: Path) -> None:
    """The test project's own middleware sets ``request.user`` from a header: a warning at
    start, and the rule keys by that user."""
    rules = [{"name": f"me.{fresh()}", "path": "/me", "key": "{user}", "limits": ["1/minute"]}]
    with AppServer(DJANGO, {"store": "memory://", "rules": rules}, tmp_path) as server:
        user = {"X-User": str(1000 + int(fresh(), 16) % 100000)}
        statuses = [httpx.get(f"{server.url}/me", headers=user).status_code for _ in range(2)]
        log = server.log_tail(200)
    assert statuses == [200, 429]
    assert log.count("which the Django middleware may not provide") == 1
    assert "only web.wsgi.django_project.django_views.HeaderUserMiddleware may set request.user" in log


# -- ASGI: a scope without "user" is found at the first request -------------------------------


class BearerName(AuthenticationBackend):
    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        scheme, _, name = conn.headers.get("authorization", "").partition(" ")
        return (AuthCredentials(["authenticated"]), SimpleUser(name)) if scheme == "Bearer" and name else None


async def home(request: Request) -> Response:
    return PlainTextResponse("ok")


def starlette(rules: list[Any], *, auth: bool) -> Starlette:
    app = Starlette(routes=[Route("/", home)])
    app.add_middleware(RateLimitMiddleware, rules=rules)
    if auth:  # added last: it runs first, so the rate limiter sees scope["user"]
        app.add_middleware(AuthenticationMiddleware, backend=BearerName())
    return app


def user_rules() -> list[Any]:
    return [
        http_rule(f"me.{fresh()}", "5/minute", key="{user}"),
        http_rule(f"either.{fresh()}", "5/minute", key="{user|client_ip}"),
    ]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ratekeeper.web" and r.levelno == logging.WARNING]


def test_asgi_without_scope_user_warns_once_per_rule(caplog: pytest.LogCaptureFixture) -> None:
    rules = user_rules()
    with caplog.at_level(logging.WARNING, "ratekeeper.web"), serve(starlette(rules, auth=False)) as base:
        assert warnings_of(caplog) == []  # nothing known at start
        with httpx.Client(base_url=base) as client:
            assert [client.get("/").status_code for _ in range(3)] == [200, 200, 200]
    (warning,) = warnings_of(caplog)  # the chain falls back to the address: no warning for it
    assert f"rule '{rules[0].name}': its key '{{user}}' needs {{user}}, " in warning
    assert "which the ASGI middleware may not provide" in warning
    assert "the first request's ASGI scope had no 'user'" in warning
    assert "add AuthenticationMiddleware before it" in warning


def test_asgi_with_authentication_middleware_warns_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with (
        caplog.at_level(logging.WARNING, "ratekeeper.web"),
        serve(starlette(user_rules(), auth=True)) as base,
        httpx.Client(base_url=base) as client,
    ):
        statuses = [client.get("/", headers={"Authorization": "Bearer alice"}).status_code for _ in range(2)]
    assert statuses == [200, 200]
    assert warnings_of(caplog) == []
