"""Finding the client's address: the peer, or trusted proxies' Forwarded / X-Forwarded-For."""

from __future__ import annotations

import pytest

from ratekeeper.errors import ConfigurationError
from ratekeeper.web.client_ip import ClientAddress, Networks, forwarded_for, parse_ip


def resolver(*trusted: str, prefix: int = 64) -> ClientAddress:
    return ClientAddress(Networks(list(trusted)), prefix)


def key(c: ClientAddress, peer: str | None, forwarded: str | None = None, xff: str | None = None) -> str | None:
    return c.resolve(peer, forwarded, xff)[1]


def test_an_untrusted_peer_is_the_client_whatever_it_claims() -> None:
    assert "198.51.100.1" == key(resolver("10.0.0.0/8"), "198.51.100.1", "for=1.2.3.4", "1.2.3.4")


def test_behind_a_trusted_proxy_the_rightmost_untrusted_hop_is_the_client() -> None:
    c = resolver("10.0.0.0/8")
    assert "203.0.113.9" == key(c, "10.0.0.1", xff="6.6.6.6, 203.0.113.9")
    assert "203.0.113.9" == key(c, "10.0.0.1", xff="6.6.6.6, 203.0.113.9, 10.1.1.1, 10.2.2.2")
    assert "203.0.113.9" == key(c, "10.0.0.1", xff="203.0.113.9:5555")


def test_when_every_hop_is_trusted_the_leftmost_is_the_client() -> None:
    assert "10.9.9.9" == key(resolver("10.0.0.0/8"), "10.0.0.1", xff="10.9.9.9, 10.1.1.1")


def test_forwarded_wins_over_x_forwarded_for_and_reads_ports_quotes_and_ipv6() -> None:
    c = resolver("127.0.0.1")
    header = 'for=6.6.6.6;by=x, For="[2001:db8:cafe::17]:4711";proto=https'
    assert "2001:db8:cafe::/64" == key(c, "127.0.0.1", header, "7.7.7.7")
    assert ["6.6.6.6", "[2001:db8:cafe::17]:4711", ""] == forwarded_for(header + ", proto=http")


def test_a_proxys_unknown_client_has_no_address_and_an_obfuscated_one_is_its_token() -> None:
    c = resolver("127.0.0.1")
    assert None is key(c, "127.0.0.1", "for=unknown")
    assert "_gazonk" == key(c, "127.0.0.1", 'for="_gazonk"')


def test_ipv6_grouping_and_ipv4_mapped_addresses() -> None:
    assert "2001:db8:1:2::/64" == key(resolver(), "2001:db8:1:2:aaaa::1")
    assert "2001:db8:1::/48" == key(resolver(prefix=48), "2001:db8:1:2::1")
    assert "2001:db8:1:2::1" == key(resolver(prefix=128), "2001:db8:1:2::1")
    assert "192.0.2.1" == key(resolver(), "::ffff:192.0.2.1")
    assert "192.0.2.1" == key(resolver(), "192.0.2.1")


def test_no_peer_means_no_client_and_a_unix_socket_path_is_kept() -> None:
    assert None is key(resolver(), None)
    assert "unix:/tmp/s" == key(resolver(), "unix:/tmp/s")


def test_bad_configuration_is_refused_at_once() -> None:
    with pytest.raises(ConfigurationError, match="not an IP network"):
        Networks(["10.0.0.0/33"], what="trusted_proxies")
    with pytest.raises(ConfigurationError, match="ipv6_prefix"):
        ClientAddress(Networks(), 129)


def test_parse_ip_forms() -> None:
    assert "::1" == str(parse_ip("[::1]:80"))
    assert "1.2.3.4" == str(parse_ip('"1.2.3.4:80"'))
    assert None is parse_ip("not-an-ip")
    assert None is parse_ip("")


def test_answers_are_remembered_per_peer_and_headers_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo gives what ``find`` gives, for each (peer, Forwarded, X-Forwarded-For), and
    starts afresh when full, so a flood of addresses costs bounded memory."""
    from ratekeeper.web import client_ip

    monkeypatch.setattr(client_ip, "MEMO_SIZE", 4)
    resolver = ClientAddress(Networks(["10.0.0.0/8"]))
    cases = [
        ("203.0.113.9", None, None),
        ("10.0.0.1", None, "198.51.100.7"),
        ("10.0.0.1", None, "198.51.100.8"),
        ("2001:db8:1:2::9", None, None),
    ]
    for case in cases + cases:
        assert resolver.find(*case) == resolver.resolve(*case)
    assert 3 == len(resolver._peers)  # two direct peers and the proxy
    assert 2 == len(resolver._memo)  # the proxy's two chains
    read: list[str] = []
    resolver.resolve("203.0.113.9", lambda: read.append("fwd") or None, lambda: read.append("xff") or None)
    assert [] == read  # an untrusted peer's forwarding headers are never even read
    for i in range(10):
        resolver.resolve(f"192.0.2.{i}", None, None)
        assert len(resolver._peers) <= 4
