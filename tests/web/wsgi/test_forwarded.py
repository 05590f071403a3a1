"""The client behind a real proxy (``web.forwarding_proxy``: a uvicorn reverse proxy)
in front of Flask, a bare WSGI app and Django under gunicorn and Django under uvicorn.

With ``X-Forwarded-For`` (the session's ``server``: nginx's way, trusting 127.0.0.1) and
with ``Forwarded`` (``hostile_server``: every loopback address a proxy, each test's proxy
connecting from an address of its own), a client's forged claims never give it a budget
of its own, and a client the proxy does not name, or whose header cannot be read, is
keyed by the proxy.
"""

from __future__ import annotations

import pytest

from web.forwarding_proxy import FORGED, client, fresh_loopback, proxy
from web.wsgi.appserver import AppServer


def statuses(base: str, address: str, headers_each: list[dict[str, str]]) -> list[int]:
    with client(base, address) as c:
        return [c.get("/ip", headers=h).status_code for h in headers_each]


def from_proxy(server: AppServer, source: str) -> int:
    """What the app answers the proxy's own address (no forwarding header)."""
    with client(server.url, source) as c:
        return c.get("/ip").status_code


def test_behind_nginx_style_x_forwarded_for_eight_forged_claims_share_one_budget(server: AppServer) -> None:
    with proxy(server.url) as front:
        spoofer = statuses(front, fresh_loopback(), FORGED)
        other = statuses(front, fresh_loopback(), [{}])
    assert [200] + [429] * 7 == spoofer
    assert [200] == other


def test_behind_a_forwarded_proxy_eight_forged_claims_share_one_budget(hostile_server: AppServer) -> None:
    with proxy(hostile_server.url, "forwarded", fresh_loopback()) as front:
        spoofer = statuses(front, fresh_loopback(), FORGED)
        other = statuses(front, fresh_loopback(), [{}])
    assert [200] + [429] * 7 == spoofer
    assert [200] == other


def test_an_unterminated_quote_is_ignored_and_the_proxy_is_the_client(hostile_server: AppServer) -> None:
    source = fresh_loopback()
    with proxy(hostile_server.url, "forwarded", source) as front:
        first = statuses(front, fresh_loopback(), [{"Forwarded": 'for="198.51.100.1'}])
        second = statuses(front, fresh_loopback(), [{"Forwarded": 'for="198.51.100.2'}])
        plain = statuses(front, fresh_loopback(), [{}])
    assert ([200], [429], [200]) == (first, second, plain)
    assert 429 == from_proxy(hostile_server, source)


@pytest.mark.parametrize("mode", ["forwarded-unknown", "forwarded-obfuscated"])
def test_a_client_the_proxy_does_not_name_is_keyed_by_the_proxy(hostile_server: AppServer, mode: str) -> None:
    source = fresh_loopback()
    with proxy(hostile_server.url, mode, source) as front:
        got = [statuses(front, fresh_loopback(), [{}])[0] for _ in range(3)]
    assert [200, 429, 429] == got
    assert 429 == from_proxy(hostile_server, source)
