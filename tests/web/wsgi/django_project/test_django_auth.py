"""``{user}`` with Django's real sessions and AuthenticationMiddleware, sync and async.

The database (SQLite) is migrated and given a user by ``django-admin`` before the server
starts. In async mode the middleware must load the user with ``await request.auser()``:
touching the lazy ``request.user`` on the event loop would raise SynchronousOnlyOperation
and turn every request into a 500.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from web.wsgi.appserver import TESTS_DIR, AppServer
from web.wsgi.checks import assert_denied

SETTINGS = "web.wsgi.django_project.django_auth_settings"
RULES = [
    {"name": "me", "path": "/me", "key": "{user}", "limits": ["1/minute"]},
    {"name": "ame", "path": "/ame", "key": "{user}", "limits": ["1/minute"]},
]


def django_admin(config: dict[str, object], *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(TESTS_DIR), DJANGO_SETTINGS_MODULE=SETTINGS)
    env["RK_WEB_CONFIG"] = json.dumps(config)
    cmd = [sys.executable, "-m", "django", *args]
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=60)


@pytest.mark.parametrize(("kind", "target"), [("gunicorn", "django_wsgi"), ("uvicorn", "django_asgi")])
def test_user_key_from_a_logged_in_session(tmp_path: Path, kind: str, target: str) -> None:
    """A logged-in user is limited by their primary key; anonymous requests skip the rule."""
    config = {"rules": RULES, "store": "memory://", "db": str(tmp_path / "db.sqlite3")}
    django_admin(config, "migrate", "--run-syncdb", "-v", "0")
    create = "from django.contrib.auth.models import User; User.objects.create_user('alice', password='pw')"
    django_admin(config, "shell", "-c", create)
    env = {"DJANGO_SETTINGS_MODULE": SETTINGS}
    with AppServer(f"web.wsgi.django_project.{target}:application", config, tmp_path, kind=kind, env=env) as server:
        for _ in range(2):
            anonymous = httpx.get(f"{server.url}/ame")
            assert anonymous.status_code == 200, server.log_tail()
            assert anonymous.json() == {"user": None}
        with httpx.Client(base_url=server.url) as client:
            login = client.post("/login", data={"username": "alice", "password": "pw"})
            assert login.status_code == 200, server.log_tail()
            pk = login.json()["user"]
            for view in ("me", "ame"):
                assert client.get(f"/{view}").json() == {"user": pk}
                assert_denied(client.get(f"/{view}"), view, 1, 60)
