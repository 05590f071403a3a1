"""Servers for the WSGI / Django tests: each a real gunicorn or uvicorn process.

``server`` is parametrised over the three ways the middleware is served (Flask under
gunicorn, Django under gunicorn's sync worker, Django under uvicorn), each started once
per session on the memory store with ``checks.common_rules()``. ``hostile_server`` runs
those and a bare WSGI app with ``checks.HOSTILE``: behind proxies that set ``Forwarded``,
with the rules the hostile-input tests aim at.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from web.wsgi.appserver import AppServer
from web.wsgi.checks import HOSTILE, OPTIONS, common_rules

TARGETS = {
    "flask": ("gunicorn", "web.wsgi.flask_app:app"),
    "django": ("gunicorn", "web.wsgi.django_project.django_wsgi:application"),
    "django-asgi": ("uvicorn", "web.wsgi.django_project.django_asgi:application"),
}


@pytest.fixture(scope="session", params=list(TARGETS))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """One server on the memory store; ``server.name`` says which of TARGETS it is."""
    kind, target = TARGETS[request.param]
    # Flask here is served by the plain WSGI middleware: no router, so no {route} rule
    rules = common_rules(router=request.param != "flask")
    config = {"store": "memory://", "rules": rules, "options": OPTIONS, "metrics": True}
    app = AppServer(target, config, tmp_path_factory.mktemp(request.param), kind=kind, name=request.param)
    with app:
        yield app


HOSTILE_TARGETS = {**TARGETS, "raw-wsgi": ("gunicorn", "web.wsgi.raw_wsgi:app")}


@pytest.fixture(scope="session", params=list(HOSTILE_TARGETS))
def hostile_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """One server with ``checks.HOSTILE``; ``hostile_server.name`` says which target it is."""
    kind, target = HOSTILE_TARGETS[request.param]
    app = AppServer(target, HOSTILE, tmp_path_factory.mktemp(f"hostile-{request.param}"), kind=kind, name=request.param)
    with app:
        yield app
