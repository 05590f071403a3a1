"""Servers for the WSGI / Django tests: each a real gunicorn or uvicorn process.

``server`` is parametrised over the three ways the middleware is served (Flask under
gunicorn, Django under gunicorn's sync worker, Django under uvicorn), each started once
per session on the memory store with ``checks.common_rules()``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from web_wsgi.appserver import AppServer
from web_wsgi.checks import OPTIONS, common_rules

TARGETS = {
    "flask": ("gunicorn", "web_wsgi.flask_app:app"),
    "django": ("gunicorn", "web_wsgi.django_wsgi:application"),
    "django-asgi": ("uvicorn", "web_wsgi.django_asgi:application"),
}


@pytest.fixture(scope="session", params=list(TARGETS))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """One server on the memory store; ``server.name`` says which of TARGETS it is."""
    kind, target = TARGETS[request.param]
    config = {"store": "memory://", "rules": common_rules(), "options": OPTIONS, "metrics": True}
    app = AppServer(target, config, tmp_path_factory.mktemp(request.param), kind=kind, name=request.param)
    with app:
        yield app
