"""``ratekeeper.web.django.ratelimit``, the per-view decorator, through the test Django
project under gunicorn (sync views) and uvicorn (ASGI: async views on the loop, sync views
in threads), on the memory store."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from web.wsgi.appserver import AppServer

TARGETS = {
    "gunicorn": "web.wsgi.django_project.django_wsgi:application",
    "uvicorn": "web.wsgi.django_project.django_asgi:application",
}


@pytest.fixture(scope="module", params=list(TARGETS))
def app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """The project with no middleware rules: only the decorators limit."""
    kind = request.param
    config = {"store": "memory://", "rules": []}
    with AppServer(TARGETS[kind], config, tmp_path_factory.mktemp(f"decorator-{kind}"), kind=kind, name=kind) as server:
        yield server


def fresh() -> str:
    return uuid.uuid4().hex[:12]


def test_block_answers_429_after_the_rate(app: AppServer) -> None:
    """``rate="3/m"`` on ``key="ip"``: three calls pass, the fourth is our problem+json."""
    with httpx.Client(base_url=app.url) as client:
        # Every test client shares 127.0.0.1: another test's calls must not use this view.
        statuses = [client.get("/rl/block").status_code for _ in range(3)]
        denied = client.get("/rl/block")
    assert statuses == [200, 200, 200]
    assert denied.status_code == 429
    assert denied.headers["content-type"] == "application/problem+json"
    assert int(denied.headers["retry-after"]) >= 1
    assert "ratelimit" in denied.headers or "x-ratelimit-limit" in denied.headers


def test_no_block_leaves_the_decision_to_the_view(app: AppServer) -> None:
    """``block=False``: the view runs every time and sees ``request.ratelimit.limited``."""
    user = str(1000 + int(fresh(), 16) % 100000)
    with httpx.Client(base_url=app.url, headers={"X-User": user}) as client:
        answers = [client.get("/rl/soft") for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert [r.json()["limited"] for r in answers] == [False, False, True]
    assert answers[0].json()["remaining"] == 1


def test_post_field_keys_apart(app: AppServer) -> None:
    """``key="post:username"``: each username has its own budget; a GET is not counted."""
    alice, bob = fresh(), fresh()
    with httpx.Client(base_url=app.url) as client:
        for_alice = [client.post("/rl/login", data={"username": alice}).json()["limited"] for _ in range(3)]
        for_bob = client.post("/rl/login", data={"username": bob}).json()
        get = client.get("/rl/login").json()
    assert for_alice == [False, False, True]
    assert for_bob["limited"] is False
    assert get == {"limited": False, "remaining": None, "mode": "sync"}


def test_async_view_sees_the_decision(app: AppServer) -> None:
    key = fresh()
    with httpx.Client(base_url=app.url, headers={"X-Api-Key": key}) as client:
        answers = [client.get("/rl/asoft").json() for _ in range(2)]
    assert [a["limited"] for a in answers] == [False, True]
    assert answers[0]["mode"] == "async"


def test_sync_and_async_views_share_one_budget(app: AppServer) -> None:
    """One group, one key: sync and async views of one process draw on one store."""
    key = fresh()
    with httpx.Client(base_url=app.url, headers={"X-Api-Key": key}) as client:
        statuses = [client.get(path).status_code for path in ["/rl/shared-sync", "/rl/shared-async"] * 3]
    assert statuses == [200, 200, 200, 200, 429, 429]


@pytest.mark.parametrize("kind", list(TARGETS))
def test_denied_view_setting(tmp_path: Path, kind: str) -> None:
    """``RATEKEEPER_DENIED_VIEW`` answers a blocked request, sync view or async."""
    config = {
        "store": "memory://",
        "rules": [],
        "denied_view": "web.wsgi.django_project.django_views.rl_denied",
    }
    with AppServer(TARGETS[kind], config, tmp_path, kind=kind) as server, httpx.Client(base_url=server.url) as client:
        for path in ["/rl/shared-sync", "/rl/shared-async"]:
            key = {"X-Api-Key": fresh()}
            statuses = [client.get(path, headers=key).status_code for _ in range(4)]
            denied = client.get(path, headers=key)
            assert statuses == [200] * 4
            assert denied.status_code == 429
            assert denied.json() == {"denied": True, "limited": True}


@pytest.mark.parametrize("kind", list(TARGETS))
def test_sync_and_async_views_share_one_redis_budget(tmp_path: Path, kind: str) -> None:
    """On Redis too, including under gunicorn, where each async view runs on an event loop
    of its own that ends with the request (the async limiter's connections must not be
    bound to one of those)."""
    store = f"redis://127.0.0.1:6379/0?prefix=rk-test-decorator-{fresh()}:"
    with (
        AppServer(TARGETS[kind], {"store": store, "rules": []}, tmp_path, kind=kind) as server,
        httpx.Client(base_url=server.url, headers={"X-Api-Key": fresh()}) as client,
    ):
        statuses = [client.get(path).status_code for path in ["/rl/shared-async", "/rl/shared-sync"] * 3]
    assert statuses == [200, 200, 200, 200, 429, 429]
