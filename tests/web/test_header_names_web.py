"""``header_names`` through the real frameworks: Starlette (httpx's ASGI transport, and a
real uvicorn), Flask (``RATEKEEPER_HEADER_NAMES``, the keyword, ``RATEKEEPER_OPTIONS``) and
Django under gunicorn (``settings.RATEKEEPER["header_names"]``; ``RATEKEEPER_HEADER_NAMES``).
A renamed field is sent under its new name on a pass and on a 429, and never under its
default name; ``Retry-After`` keeps its name; a bad mapping stops the start."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from flask import Flask
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ratekeeper.errors import ConfigurationError
from ratekeeper.web import RateLimitMiddleware
from ratekeeper.web.flask import RateLimiter
from web.wsgi.appserver import AppServer

from .conftest import http_rule
from .uvicorn_server import serve

RENAMED = {
    "X-RateLimit-Limit": "X-Rate-Limit-Limit",
    "X-RateLimit-Remaining": "X-Rate-Limit-Remaining",
    "X-RateLimit-Reset": "X-Rate-Limit-Reset",
    "RateLimit": "Acme-RateLimit",
    "RateLimit-Policy": None,  # left out
}
SENT = {"x-rate-limit-limit", "x-rate-limit-remaining", "x-rate-limit-reset", "acme-ratelimit"}
DEFAULTS = {"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "ratelimit", "ratelimit-policy"}


def fresh() -> str:
    return uuid.uuid4().hex[:12]


def assert_renamed(response: httpx.Response | Any, *, remaining: int) -> None:
    """``response`` (httpx's or Flask's test client's) carries the renamed fields only."""
    names = {name.lower() for name in response.headers.keys()}  # noqa: SIM118 - werkzeug's Headers too
    assert names >= SENT, names
    assert not names & DEFAULTS, names
    assert response.headers["X-Rate-Limit-Limit"] == "2"
    assert response.headers["X-Rate-Limit-Remaining"] == str(remaining)
    assert 1 <= int(response.headers["X-Rate-Limit-Reset"]) <= 60
    assert response.headers["Acme-RateLimit"].endswith(f";r={remaining};t={response.headers['X-Rate-Limit-Reset']}")


def assert_sequence(responses: list[Any]) -> None:
    """Two passes then a 429 under ``2/minute``, each with the renamed fields."""
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert_renamed(responses[0], remaining=1)
    assert_renamed(responses[1], remaining=0)
    assert_renamed(responses[2], remaining=0)
    assert "retry-after" not in {n.lower() for n in responses[1].headers.keys()}  # noqa: SIM118
    assert 1 <= int(responses[2].headers["Retry-After"]) <= 60


# -- Starlette ------------------------------------------------------------------------------------


async def item(request: Request) -> Response:
    return JSONResponse({"user": request.path_params["user"]})


def starlette_app(rule_name: str, **options: Any) -> Starlette:
    rule = http_rule(rule_name, "2/minute", path="/items/{user}", key="{path.user}")
    app = Starlette(routes=[Route("/items/{user}", item)])
    app.add_middleware(RateLimitMiddleware, rules=[rule], **options)
    return app


def test_starlette_sends_the_renamed_fields_on_a_pass_and_on_a_429(rule_name: str) -> None:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=starlette_app(rule_name, header_names=RENAMED))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return [await client.get("/items/alice") for _ in range(3)]

    assert_sequence(asyncio.run(run()))


def test_starlette_under_uvicorn_sends_the_renamed_fields(rule_name: str) -> None:
    with serve(starlette_app(rule_name, header_names=RENAMED)) as base, httpx.Client(base_url=base) as client:
        responses = [client.get("/items/bob") for _ in range(3)]
    assert_sequence(responses)


def test_uvicorn_refuses_to_start_with_a_bad_mapping(rule_name: str) -> None:
    """The middleware's start fails (lifespan) with the mapping's problem, not a 500 per request."""
    app = starlette_app(rule_name, header_names={"X-RateLimit-Remaning": "X-Left"})
    with pytest.raises(RuntimeError, match="did not start"), serve(app):
        pass


# -- Flask ----------------------------------------------------------------------------------------


def flask_app(**config: Any) -> tuple[Flask, RateLimiter]:
    app = Flask(__name__)
    app.config.update(config)
    limiter = RateLimiter()

    @app.get("/items/<user>")
    @limiter.limit("2/minute", key="{path.user}")
    def items(user: str) -> str:
        return user

    return app, limiter


@pytest.mark.parametrize(
    ("config", "keywords"),
    [
        ({"RATEKEEPER_HEADER_NAMES": RENAMED}, {}),
        ({"RATEKEEPER_OPTIONS": {"header_names": RENAMED}}, {}),
        ({"RATEKEEPER_HEADER_NAMES": {"X-RateLimit-Limit": "Wrong"}}, {"header_names": RENAMED}),
    ],
    ids=["RATEKEEPER_HEADER_NAMES", "RATEKEEPER_OPTIONS", "the keyword wins"],
)
def test_flask_sends_the_renamed_fields(config: dict[str, Any], keywords: dict[str, Any]) -> None:
    app, limiter = flask_app(**config)
    limiter.init_app(app, **keywords)
    client = app.test_client()
    user = fresh()
    assert_sequence([client.get(f"/items/{user}") for _ in range(3)])


def test_flask_refuses_a_bad_mapping_at_init_app() -> None:
    app, limiter = flask_app(RATEKEEPER_HEADER_NAMES={"Retry-After": "X-Retry"})
    with pytest.raises(ConfigurationError, match="cannot rename or leave out Retry-After"):
        limiter.init_app(app)


def test_flask_refuses_the_mapping_given_twice() -> None:
    """``RATEKEEPER_HEADER_NAMES`` and ``RATEKEEPER_OPTIONS["header_names"]``: which one was meant?"""
    app, limiter = flask_app(RATEKEEPER_HEADER_NAMES=RENAMED, RATEKEEPER_OPTIONS={"header_names": RENAMED})
    with pytest.raises(ConfigurationError, match="RATEKEEPER_HEADER_NAMES"):
        limiter.init_app(app)


# -- Django ---------------------------------------------------------------------------------------


def test_django_under_gunicorn_sends_the_renamed_fields(tmp_path: Path) -> None:
    config = {
        "store": "memory://",
        "rules": [{"name": "items", "limits": ["2/minute"], "path": "/items/{user}", "key": "{path.user}"}],
        "options": {"header_names": RENAMED},
    }
    target = "web.wsgi.django_project.django_wsgi:application"
    with AppServer(target, config, tmp_path, kind="gunicorn") as server, httpx.Client(base_url=server.url) as client:
        user = fresh()
        responses = [client.get(f"/items/{user}") for _ in range(3)]
    assert_sequence(responses)


def test_django_reads_ratekeeper_header_names_and_refuses_it_given_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("django")
    from ratekeeper.web.django import settings_options

    conf = {"rules": [], "store": "memory://"}
    monkeypatch.setattr("django.conf.settings", SimpleNamespace(RATEKEEPER=conf, RATEKEEPER_HEADER_NAMES=RENAMED))
    assert settings_options()["header_names"] == RENAMED
    both = {**conf, "header_names": RENAMED}
    monkeypatch.setattr("django.conf.settings", SimpleNamespace(RATEKEEPER=both, RATEKEEPER_HEADER_NAMES=RENAMED))
    with pytest.raises(ConfigurationError, match="RATEKEEPER_HEADER_NAMES"):
        settings_options()


def test_django_ratelimit_decorator_answers_its_429_under_the_renamed_fields(tmp_path: Path) -> None:
    """``@ratelimit(key="ip", rate="3/m", block=True)`` (``/rl/block``): the settings' names."""
    config = {"store": "memory://", "rules": [], "options": {"header_names": RENAMED}}
    target = "web.wsgi.django_project.django_wsgi:application"
    with AppServer(target, config, tmp_path, kind="gunicorn") as server, httpx.Client(base_url=server.url) as client:
        statuses = [client.get("/rl/block").status_code for _ in range(3)]
        denied = client.get("/rl/block")
    assert statuses == [200, 200, 200]
    assert denied.status_code == 429
    names = {name.lower() for name in denied.headers.keys()}  # noqa: SIM118
    assert names >= SENT
    assert not names & DEFAULTS
    assert denied.headers["X-Rate-Limit-Remaining"] == "0"
    assert int(denied.headers["Retry-After"]) >= 1


def test_django_refuses_to_start_with_a_bad_mapping(tmp_path: Path) -> None:
    config = {"store": "memory://", "rules": [], "options": {"header_names": {"Retry-After": "X-Retry"}}}
    target = "web.wsgi.django_project.django_wsgi:application"
    with pytest.raises(RuntimeError, match="cannot rename or leave out Retry-After"):
        AppServer(target, config, tmp_path, kind="gunicorn").start()
