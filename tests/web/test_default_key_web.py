"""Through real servers: a rule without ``key`` gives each client its own budget, ``key: "*"``
one budget that every client shares.

The two clients connect from two loopback addresses of their own (127.0.0.2 and 127.0.0.3),
so the servers see two real peers, with no forwarding header and no trusted proxy. The
rules reach each app as the rules file's entries in dicts (Django: in
``settings.RATEKEEPER["rules"]``), read by the product as a user's would be.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from web.wsgi.appserver import AppServer

TARGETS = {
    "flask-wsgi-middleware": ("gunicorn", "web.wsgi.flask_app:app"),
    "django": ("gunicorn", "web.wsgi.django_project.django_wsgi:application"),
    "django-asgi": ("uvicorn", "web.wsgi.django_project.django_asgi:application"),
    "starlette": ("uvicorn", "web.wsgi.starlette_app:app"),
}


@pytest.fixture(params=list(TARGETS))
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppServer]:
    kind, target = TARGETS[request.param]
    suffix = uuid.uuid4().hex[:8]
    rules = [
        {"name": f"per_client.{suffix}", "path": "/items/mine", "limits": ["1/minute"]},  # no key
        {"name": f"everyone.{suffix}", "path": "/items/ours", "key": "*", "limits": ["1/minute"]},
    ]
    config = {"store": "memory://", "rules": rules, "rules_as_dicts": True}
    with AppServer(target, config, tmp_path, kind=kind, name=request.param) as app:
        yield app


@pytest.fixture
def clients(server: AppServer) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """Two clients, each from its own loopback address."""
    with (
        httpx.Client(base_url=server.url, transport=httpx.HTTPTransport(local_address="127.0.0.2")) as a,
        httpx.Client(base_url=server.url, transport=httpx.HTTPTransport(local_address="127.0.0.3")) as b,
    ):
        yield a, b


def test_a_rule_without_key_gives_each_client_its_own_budget(clients: tuple[httpx.Client, httpx.Client]) -> None:
    a, b = clients
    assert [a.get("/items/mine").status_code, a.get("/items/mine").status_code] == [200, 429]
    assert b.get("/items/mine").status_code == 200  # the other client's budget is untouched
    assert b.get("/items/mine").status_code == 429


def test_a_star_key_is_one_budget_every_client_shares(clients: tuple[httpx.Client, httpx.Client]) -> None:
    a, b = clients
    assert a.get("/items/ours").status_code == 200
    refused = b.get("/items/ours")  # another client: the same budget, already spent
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
