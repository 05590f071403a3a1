"""``ratelimit(key="ip")`` finds the client as the middleware does: behind the proxies the
settings trust (``RATEKEEPER["trusted_proxies"]``), by the address they forwarded, and an
IPv6 client by its /64 (one host holds a whole /64: single addresses would be 2**64
budgets). Through the test Django project under gunicorn, on the memory store."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from web.wsgi.appserver import AppServer

TARGET = "web.wsgi.django_project.django_wsgi:application"


@pytest.fixture(scope="module")
def behind_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    config = {"store": "memory://", "rules": [], "options": {"trusted_proxies": ["127.0.0.1/32"]}}
    with AppServer(TARGET, config, tmp_path_factory.mktemp("decorator-proxy"), kind="gunicorn", name="proxy") as server:
        yield server


def _statuses(app: AppServer, forwarded: str, n: int) -> list[int]:
    with httpx.Client(base_url=app.url, headers={"X-Forwarded-For": forwarded}) as client:
        return [client.get("/rl/block").status_code for _ in range(n)]


def test_clients_behind_a_trusted_proxy_each_have_their_own_budget(behind_proxy: AppServer) -> None:
    """``/rl/block`` is ``key="ip", rate="3/m"``: one client's four calls end in a 429, the
    next client (another forwarded address, the same proxy) still passes."""
    assert [200, 200, 200, 429] == _statuses(behind_proxy, "198.51.100.7", 4)
    assert [200] == _statuses(behind_proxy, "198.51.100.8", 1)


def test_an_ipv6_client_cannot_buy_budgets_by_changing_address_within_its_64(behind_proxy: AppServer) -> None:
    spent = [_statuses(behind_proxy, f"2001:db8:7:7::{i}", 1)[0] for i in range(1, 5)]
    assert [200, 200, 200, 429] == spent
    assert [200] == _statuses(behind_proxy, "2001:db8:7:8::1", 1)  # the next /64 is another client
