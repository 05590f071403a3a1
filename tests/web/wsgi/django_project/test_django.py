"""Django specifics, through real servers: the limiter each mode uses, and
``settings.RATEKEEPER = {"rules": "rules.yaml"}`` read from a file beside ``BASE_DIR``."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from web.wsgi.appserver import AppServer
from web.wsgi.checks import assert_denied, burst


@pytest.mark.parametrize("server", ["django", "django-asgi"], indirect=True)
def test_each_mode_decides_with_its_limiter(server: AppServer) -> None:
    """Under uvicorn (async chain) the middleware awaits an AsyncLimiter; under gunicorn it uses the Limiter."""
    expected = "AsyncLimiter" if server.name == "django-asgi" else "Limiter"
    assert httpx.get(f"{server.url}/mode").json() == {"limiters": [expected]}


RULES_YAML = """\
rules:
  - name: partner.items
    match: {methods: [GET], path: "/items/{user}"}
    key: "{path.user}"
    limits: ["1/3s"]
"""


@pytest.mark.parametrize(("kind", "target"), [("gunicorn", "django_wsgi"), ("uvicorn", "django_asgi")])
def test_rules_file_relative_to_base_dir(tmp_path: Path, kind: str, target: str) -> None:
    """``"rules": "rules.yaml"`` is read from BASE_DIR; the partner burst admits exactly one."""
    (tmp_path / "rules.yaml").write_text(RULES_YAML)
    config = {"rules": "rules.yaml", "base_dir": str(tmp_path), "store": "memory://"}
    with AppServer(f"web.wsgi.django_project.{target}:application", config, tmp_path, kind=kind) as server:
        responses = burst(f"{server.url}/items/{uuid.uuid4().hex[:12]}")
        assert sorted(r.status_code for r in responses) == [200] + [429] * 9
        for r in responses:
            if r.status_code == 429:
                assert_denied(r, "partner.items", 1, 3)
