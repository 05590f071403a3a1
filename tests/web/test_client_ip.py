"""Finding the client's address: the peer, or what the trusted proxies' one configured
header (X-Forwarded-For or Forwarded) says, read for at most ``trusted_hops`` entries."""

from __future__ import annotations

import pytest

from ratekeeper.errors import ConfigurationError
from ratekeeper.web.client_ip import ClientAddress, Networks, forwarded_for, parse_ip


def resolver(*trusted: str, prefix: int = 64, header: str = "x-forwarded-for", hops: int = 1) -> ClientAddress:
    return ClientAddress(Networks(list(trusted)), prefix, header, hops)


def key(c: ClientAddress, peer: str | None, value: str | None = None) -> str | None:
    return c.resolve(peer, value)[1]


def test_an_untrusted_peer_is_the_client_whatever_it_claims() -> None:
    assert "198.51.100.1" == key(resolver("10.0.0.0/8"), "198.51.100.1", "1.2.3.4")
    assert "198.51.100.1" == key(resolver("10.0.0.0/8", header="forwarded"), "198.51.100.1", "for=1.2.3.4")


def test_one_trusted_hop_reads_only_the_entry_the_peer_appended() -> None:
    c = resolver("10.0.0.0/8")
    assert "203.0.113.9" == key(c, "10.0.0.1", "6.6.6.6, 203.0.113.9")
    assert "203.0.113.9" == key(c, "10.0.0.1", "203.0.113.9:5555")
    # A client inside the trusted networks cannot name someone else by sending its own entry.
    assert "10.1.1.1" == key(c, "10.0.0.1", "6.6.6.6, 10.1.1.1")


def test_more_hops_walk_left_while_the_address_found_is_a_trusted_proxy() -> None:
    c = resolver("10.0.0.0/8", hops=3)
    assert "203.0.113.9" == key(c, "10.0.0.1", "6.6.6.6, 203.0.113.9, 10.1.1.1, 10.2.2.2")
    assert "10.9.9.9" == key(c, "10.0.0.1", "6.6.6.6, 10.9.9.9, 10.1.1.1, 10.2.2.2")  # 6.6.6.6 is never read
    assert "10.9.9.9" == key(c, "10.0.0.1", "10.9.9.9, 10.1.1.1")  # fewer entries: the leftmost
    assert "198.51.100.7" == key(c, "10.0.0.1", "203.0.113.9, 198.51.100.7")  # stops at the first untrusted


def test_only_the_configured_header_is_read() -> None:
    xff = resolver("127.0.0.1")
    assert "127.0.0.1" == key(xff, "127.0.0.1", None)
    fwd = resolver("127.0.0.1", header="forwarded")
    header = 'for=6.6.6.6;by=x, For="[2001:db8:cafe::17]:4711";proto=https'
    assert "2001:db8:cafe::/64" == key(fwd, "127.0.0.1", header)
    assert ["6.6.6.6", "[2001:db8:cafe::17]:4711", ""] == forwarded_for(header + ", proto=http")


@pytest.mark.parametrize(
    "header",
    [
        'for="6.6.6.6, for=203.0.113.9',  # a client's unterminated quote swallowing the proxy's element
        "for=6.6.6.6;for=7.7.7.7, for=203.0.113.9",  # a parameter twice in one element
        "for=[2001:db8::1], for=203.0.113.9",  # an IPv6 node must be quoted
        "for=6.6.6.6 junk, for=203.0.113.9",
        'for="6.6.6.6\\',
        "for",
    ],
)
def test_a_malformed_forwarded_header_is_ignored_and_the_peer_is_the_client(header: str) -> None:
    assert forwarded_for(header) is None
    assert "127.0.0.1" == key(resolver("127.0.0.1", header="forwarded"), "127.0.0.1", header)


@pytest.mark.parametrize("node", ["unknown", "UNKNOWN", "_gazonk", '"_hidden:_port"', "not-an-ip", '"[::1"'])
def test_an_unknown_or_obfuscated_client_is_keyed_by_the_proxy_that_reported_it(node: str) -> None:
    fwd = resolver("127.0.0.1", "10.0.0.0/8", header="forwarded", hops=2)
    assert "127.0.0.1" == key(fwd, "127.0.0.1", f"for={node}")
    assert "10.0.0.7" == key(fwd, "127.0.0.1", f"for={node}, for=10.0.0.7")
    xff = resolver("127.0.0.1", "10.0.0.0/8", hops=2)
    assert "127.0.0.1" == key(xff, "127.0.0.1", node.strip('"'))
    assert "10.0.0.7" == key(xff, "127.0.0.1", f"{node.strip(chr(34))}, 10.0.0.7")


def test_ipv6_grouping_and_ipv4_mapped_addresses() -> None:
    assert "2001:db8:1:2::/64" == key(resolver(), "2001:db8:1:2:aaaa::1")
    assert "2001:db8:1::/48" == key(resolver(prefix=48), "2001:db8:1:2::1")
    assert "2001:db8:1:2::1" == key(resolver(prefix=128), "2001:db8:1:2::1")
    assert "192.0.2.1" == key(resolver(), "::ffff:192.0.2.1")
    assert "192.0.2.1" == key(resolver(), "192.0.2.1")
    assert "192.0.2.1" == key(resolver("127.0.0.1"), "127.0.0.1", "::ffff:192.0.2.1")


def test_no_peer_means_no_client_and_a_unix_socket_path_is_kept() -> None:
    assert None is key(resolver(), None)
    assert "unix:/tmp/s" == key(resolver(), "unix:/tmp/s")


def test_bad_configuration_is_refused_at_once() -> None:
    with pytest.raises(ConfigurationError, match="not an IP network"):
        Networks(["10.0.0.0/33"], what="trusted_proxies")
    with pytest.raises(ConfigurationError, match="ipv6_prefix"):
        ClientAddress(Networks(), 129)
    with pytest.raises(ConfigurationError, match="forwarded_header must be 'x-forwarded-for'"):
        ClientAddress(Networks(), 64, "x-real-ip")
    for hops in (0, 33, "1", True):
        with pytest.raises(ConfigurationError, match="trusted_hops must be an integer from 1 to 32"):
            ClientAddress(Networks(), 64, "forwarded", hops)  # type: ignore[arg-type]
    assert "forwarded" == ClientAddress(Networks(), 64, "Forwarded").forwarded_header


def test_parse_ip_forms() -> None:
    assert "::1" == str(parse_ip("[::1]:80"))
    assert "1.2.3.4" == str(parse_ip('"1.2.3.4:80"'))
    assert None is parse_ip("not-an-ip")
    assert None is parse_ip("")


def test_answers_are_remembered_per_peer_and_headers_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo gives what ``find`` gives, for each (peer, header), and starts afresh when
    full, so a flood of addresses costs bounded memory."""
    from ratekeeper.web import client_ip

    monkeypatch.setattr(client_ip, "MEMO_SIZE", 4)
    resolver = ClientAddress(Networks(["10.0.0.0/8"]))
    cases = [
        ("203.0.113.9", None),
        ("10.0.0.1", "198.51.100.7"),
        ("10.0.0.1", "198.51.100.8"),
        ("2001:db8:1:2::9", None),
    ]
    for case in cases + cases:
        assert resolver.find(*case) == resolver.resolve(*case)
    assert 3 == len(resolver._peers)  # two direct peers and the proxy
    assert 2 == len(resolver._memo)  # the proxy's two chains
    read: list[str] = []
    resolver.resolve("203.0.113.9", lambda: read.append("xff") or None)
    assert [] == read  # an untrusted peer's forwarding header is never even read
    for i in range(10):
        resolver.resolve(f"192.0.2.{i}", None)
        assert len(resolver._peers) <= 4
