"""The client behind a real proxy, in every ASGI integration: a uvicorn-served reverse
proxy (``forwarding_proxy``) in front of the app, itself served by uvicorn, and clients
connecting from distinct loopback addresses.

The app trusts the proxy (127.0.0.1) and keys a 1/minute rule by ``{client_ip}``. What a
client writes in its own ``Forwarded`` or ``X-Forwarded-For`` never gives it a budget of
its own; a client the proxy will not name (``unknown``, obfuscated) or whose header
cannot be read is keyed by the proxy's address, never let through unlimited.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .asgi_apps import KINDS, make
from .conftest import http_rule
from .forwarding_proxy import FORGED, client, fresh_loopback, proxy
from .uvicorn_server import serve

PROXY = "127.0.0.1"


kinds = pytest.mark.parametrize("kind", KINDS)


def app(kind: str, rule_name: str, **options: Any) -> Any:
    rule = http_rule(rule_name, "1/minute", key="{client_ip}")
    return make(kind, [rule], trusted_proxies=[PROXY], **options)


def statuses(base: str, address: str, headers_each: list[dict[str, str]]) -> list[int]:
    with client(base, address) as c:
        return [c.get("/ip", headers=h).status_code for h in headers_each]


@kinds
@pytest.mark.parametrize("header", ["x-forwarded-for", "forwarded"])
def test_eight_forged_claims_share_the_clients_one_budget(kind: str, header: str, rule_name: str) -> None:
    """nginx appends X-Forwarded-For (the default header); a proxy set up for RFC 7239
    appends Forwarded (``forwarded_header="forwarded"``). Either way the eight forged
    values of one client are one client, and another client has its own budget."""
    mode = "x-forwarded-for" if header == "x-forwarded-for" else "forwarded"
    options = {} if header == "x-forwarded-for" else {"forwarded_header": "forwarded"}
    with serve(app(kind, rule_name, **options)) as backend, proxy(backend, mode) as front:
        spoofer = statuses(front, fresh_loopback(), FORGED)
        other = statuses(front, fresh_loopback(), [{}])
    assert [200] + [429] * 7 == spoofer
    assert [200] == other


@kinds
def test_an_unterminated_quote_is_ignored_and_the_proxy_is_the_client(kind: str, rule_name: str) -> None:
    """``Forwarded: for="198.51.100.1`` swallows the element the proxy appends: the header
    is not read, the client is the last trusted hop (the proxy), so two such clients share
    the proxy's budget, as does the proxy's own request, while a well-behaved client has
    its own."""
    broken = {"Forwarded": 'for="198.51.100.1'}
    with serve(app(kind, rule_name, forwarded_header="forwarded")) as backend, proxy(backend, "forwarded") as front:
        first = statuses(front, fresh_loopback(), [broken])
        second = statuses(front, fresh_loopback(), [broken, {"Forwarded": 'for="198.51.100.2'}])
        plain = statuses(front, fresh_loopback(), [{}])
        from_proxy = httpx.get(f"{backend}/ip", timeout=20.0).status_code  # peer 127.0.0.1, no header
    assert [200] == first
    assert [429, 429] == second
    assert [200] == plain
    assert 429 == from_proxy


@kinds
@pytest.mark.parametrize("mode", ["forwarded-unknown", "forwarded-obfuscated"])
def test_a_client_the_proxy_does_not_name_is_keyed_by_the_proxy(kind: str, mode: str, rule_name: str) -> None:
    """``for=unknown`` and ``for=_<opaque>`` (a different one per client) are not
    addresses: the rule applies, keyed by the proxy that wrote them."""
    with serve(app(kind, rule_name, forwarded_header="forwarded")) as backend, proxy(backend, mode) as front:
        got = [statuses(front, fresh_loopback(), [{}])[0] for _ in range(3)]
        from_proxy = httpx.get(f"{backend}/ip", timeout=20.0).status_code
    assert [200, 429, 429] == got
    assert 429 == from_proxy


@kinds
def test_two_trusted_hops_read_two_entries_and_no_more(kind: str, rule_name: str) -> None:
    """Two proxies in front (``trusted_hops=2``): the entry the outer proxy appended names
    the client; what the client wrote left of it does not."""
    with (
        serve(app(kind, rule_name, trusted_hops=2)) as backend,
        proxy(backend) as inner,
        proxy(inner) as outer,
    ):
        one = fresh_loopback()
        got = statuses(outer, one, [{"X-Forwarded-For": "198.51.100.7"}, {"X-Forwarded-For": "198.51.100.8"}])
        other = statuses(outer, fresh_loopback(), [{}])
    assert [200, 429] == got
    assert [200] == other
