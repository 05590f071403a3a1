"""The client's address: the TCP peer, or what the trusted proxies in front say it was.

Forwarding headers are read only when the peer itself is a trusted proxy (anyone else
can write them), and only the ONE header the proxies are configured to set
(``forwarded_header``): ``X-Forwarded-For`` by default (what nginx, Envoy, HAProxy and
the cloud balancers append), or RFC 7239 ``Forwarded`` when asked. A proxy passes the
other header through from the client untouched, so believing it would let a client
name itself.

The header is read right to left, one entry per trusted hop: the peer's entry first,
then, while the address found is itself a trusted proxy, the entry that proxy appended,
for at most ``trusted_hops`` entries (the number of proxies in front of the app). The
client is the first address that is not a trusted proxy, or the one ``trusted_hops``
entries in. What lies further left was written by the client and is never read.

A ``Forwarded`` header that does not follow RFC 7239's grammar (an unterminated quote,
a stray character, a parameter twice in one element) is not read at all: a client's
unterminated quote would otherwise swallow what the proxy appended. An entry that is
``unknown``, obfuscated (``_hidden``) or not an address says nothing usable about the
client, so the client is keyed by the address of the trusted hop that wrote it: a rule
keyed by ``{client_ip}`` always applies behind a proxy, never skipped.

IPv6 clients are grouped by prefix (``/64`` by default: one subscriber usually owns a
whole /64, and limiting single addresses in it limits nothing); IPv4 addresses are kept
whole. An IPv4-mapped IPv6 address (``::ffff:192.0.2.1``) counts as its IPv4 address.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ratekeeper.errors import ConfigurationError

__all__ = [
    "FORWARDED_HEADERS",
    "MAX_TRUSTED_HOPS",
    "ClientAddress",
    "Networks",
    "client_address",
    "forwarded_for",
    "parse_ip",
    "x_forwarded_for",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

FORWARDED_HEADERS = ("x-forwarded-for", "forwarded")
"""The values of ``forwarded_header``: the one header trusted proxies are believed in."""

MAX_TRUSTED_HOPS = 32
"""The most ``trusted_hops`` may be (a chain of proxies is a handful long)."""


class Networks:
    """A set of IP networks (``"10.0.0.0/8"``, ``"127.0.0.1"``, ``"::1"``), checked by membership."""

    __slots__ = ("networks",)

    def __init__(self, networks: Iterable[str | IPNetwork | IPAddress] | str | None = None, *, what: str = "") -> None:
        if networks is None:
            networks = ()
        elif isinstance(networks, str):
            networks = [networks]
        parsed: list[IPNetwork] = []
        for item in networks:
            try:
                parsed.append(ipaddress.ip_network(item, strict=False))
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(
                    f"{what or 'networks'}: {item!r} is not an IP network; write e.g. '10.0.0.0/8' or '::1'"
                ) from exc
        self.networks = tuple(parsed)

    def __contains__(self, address: object) -> bool:
        if not isinstance(address, ipaddress.IPv4Address | ipaddress.IPv6Address):
            return False
        return any(address.version == n.version and address in n for n in self.networks)

    def __bool__(self) -> bool:
        return bool(self.networks)


def parse_ip(text: str | None) -> IPAddress | None:
    """An address from ``1.2.3.4``, ``1.2.3.4:80``, ``::1``, ``[::1]:80`` or ``"[::1]"``; None if not one."""
    if not text:
        return None
    text = text.strip().strip('"')
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        text = text[1:end]
    elif text.count(":") == 1:  # IPv4 with a port; a bare IPv6 address has several colons
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def forwarded_for(values: str) -> list[str] | None:
    """The ``for=`` node of each element of a ``Forwarded`` header, in order (``""`` for an
    element without one); None when the header does not follow RFC 7239 §4."""
    nodes: list[str] = []
    pos, end = 0, len(values)
    while True:
        node: str | None = None
        seen: set[str] = set()
        while True:  # the pairs of one element, separated by ";"
            pos = _skip_ows(values, pos)
            m = _TOKEN.match(values, pos)
            if m is not None:
                name = m.group().lower()
                pos = m.end()
                if pos >= end or values[pos] != "=" or name in seen:
                    return None
                seen.add(name)
                parsed = _value(values, pos + 1)
                if parsed is None:
                    return None
                value, pos = parsed
                if name == "for":
                    node = value
                pos = _skip_ows(values, pos)
            if pos < end and values[pos] == ";":
                pos += 1
                continue
            break
        if seen:
            nodes.append(node or "")
        if pos >= end:
            return nodes
        if values[pos] != ",":
            return None
        pos += 1


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_QUOTED_TEXT = re.compile(r"[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]*")


def _skip_ows(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    return pos


def _value(text: str, pos: int) -> tuple[str, int] | None:
    """A token or a quoted-string at ``pos``, unquoted, and where it ends; None if neither."""
    if pos < len(text) and text[pos] == '"':
        out: list[str] = []
        pos += 1
        while True:
            m = _QUOTED_TEXT.match(text, pos)
            assert m is not None  # the pattern matches the empty string
            out.append(m.group())
            pos = m.end()
            if pos >= len(text):
                return None  # an unterminated quote
            if text[pos] == '"':
                return "".join(out), pos + 1
            if text[pos] != "\\" or pos + 1 >= len(text) or text[pos + 1] in "\r\n\x00":
                return None
            out.append(text[pos + 1])
            pos += 2
    m = _TOKEN.match(text, pos)
    return None if m is None else (m.group(), m.end())


def x_forwarded_for(values: str) -> list[str]:
    """The entries of an ``X-Forwarded-For`` header, in order (not checked: see ``_node``)."""
    return [v.strip(" \t") for v in values.split(",")]


_PORT = re.compile(r"[0-9]{1,5}|_[A-Za-z0-9._-]+")


def _node(text: str) -> IPAddress | None:
    """The address a forwarding entry names: ``1.2.3.4``, ``1.2.3.4:80``, ``[::1]``,
    ``[::1]:80`` (and a bare ``::1`` in ``X-Forwarded-For``); None for anything else
    (``unknown``, an obfuscated ``_node``, or text that is not an address)."""
    host, port = text, ""
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            return None
        host, rest = text[1:close], text[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                return None
            port = rest[1:]
            if not _PORT.fullmatch(port):
                return None
        try:
            address: IPAddress = ipaddress.IPv6Address(host)
        except ValueError:
            return None
    else:
        if text.count(":") == 1:
            host, port = text.split(":")
            if not _PORT.fullmatch(port):
                return None
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id is not None:
            return None
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
    return address


MEMO_SIZE = 65_536
"""How many (peer, forwarding header) answers ``ClientAddress`` keeps."""

Found = tuple[IPAddress | None, str | None]


@dataclass(frozen=True, slots=True)
class ClientAddress:
    """How to find the client: which proxies to believe, which header they set, how many
    of them there are, and how to group IPv6 addresses (see the module docstring)."""

    trusted_proxies: Networks
    ipv6_prefix: int = 64
    forwarded_header: str = "x-forwarded-for"
    trusted_hops: int = 1
    _memo: dict[tuple[str | None, str | None], Found] = field(default_factory=dict, compare=False, repr=False)
    _peers: dict[str | None, tuple[bool, Found]] = field(default_factory=dict, compare=False, repr=False)
    """Per peer: whether it is a trusted proxy, and the answer when it is not."""

    def __post_init__(self) -> None:
        if type(self.ipv6_prefix) is not int or not 0 <= self.ipv6_prefix <= 128:
            raise ConfigurationError(f"ipv6_prefix must be an integer from 0 to 128, got {self.ipv6_prefix!r}")
        if not isinstance(self.forwarded_header, str) or self.forwarded_header.lower() not in FORWARDED_HEADERS:
            raise ConfigurationError(
                f"forwarded_header must be {FORWARDED_HEADERS[0]!r} (nginx, Envoy, cloud balancers) or "
                f"{FORWARDED_HEADERS[1]!r} (RFC 7239): the one header your proxies set, got {self.forwarded_header!r}"
            )
        object.__setattr__(self, "forwarded_header", self.forwarded_header.lower())
        if type(self.trusted_hops) is not int or not 1 <= self.trusted_hops <= MAX_TRUSTED_HOPS:
            raise ConfigurationError(
                f"trusted_hops must be an integer from 1 to {MAX_TRUSTED_HOPS}, the number of proxies in front "
                f"of the app that append to {self.forwarded_header}, got {self.trusted_hops!r}"
            )

    def resolve(self, peer: str | None, forwarded: str | Callable[[], str | None] | None) -> Found:
        """``find`` remembered: parsing addresses costs more than the rest of a request's key,
        and a server sees the same few peers (and proxy chains) again and again.
        ``forwarded`` is the value of the ``forwarded_header``, or a callable giving it
        (``lambda: headers.get(...)``): read only when the peer is a trusted proxy.
        Bounded: each memo starts afresh at ``MEMO_SIZE`` entries."""
        peers = self._peers
        direct = peers.get(peer)
        if direct is None:
            address = parse_ip(peer)
            if address is None:
                direct = (False, (None, peer or None))
            else:
                direct = (address in self.trusted_proxies, (address, self.group(address)))
            if len(peers) >= MEMO_SIZE:
                peers.clear()
            peers[peer] = direct
        if not direct[0]:
            return direct[1]
        given = (peer, forwarded() if callable(forwarded) else forwarded)
        memo = self._memo
        found = memo.get(given)
        if found is None:
            found = self.find(*given)
            if len(memo) >= MEMO_SIZE:
                memo.clear()
            memo[given] = found
        return found

    def find(self, peer: str | None, forwarded: str | None) -> Found:
        """(the client's address, the client as a key part) for one request.

        The key part is the address (IPv6 grouped: ``2001:db8:1:2::/64``). Without a peer
        address (a Unix socket) it is the peer as given, None when there is none.
        """
        address = parse_ip(peer)
        if address is None:
            return None, peer or None
        client = address
        if address in self.trusted_proxies and forwarded:
            client = self._walk(address, forwarded)
        return client, self.group(client)

    def _walk(self, peer: IPAddress, value: str) -> IPAddress:
        """The client behind the trusted ``peer``, from its forwarding header ``value``."""
        if self.forwarded_header == "forwarded":
            entries = forwarded_for(value)
            if entries is None:
                return peer  # malformed: no entry of it can be told from the client's own text
        else:
            entries = x_forwarded_for(value)
        client = peer
        for n in range(min(self.trusted_hops, len(entries))):
            named = _node(entries[-1 - n])
            if named is None:
                return client  # unknown, obfuscated or garbage: keyed by the hop that wrote it
            client = named
            if client not in self.trusted_proxies:
                break
        return client

    def group(self, address: IPAddress) -> str:
        """The key part of ``address``: IPv4 as is, IPv6 as its ``/ipv6_prefix`` network."""
        if isinstance(address, ipaddress.IPv4Address) or self.ipv6_prefix == 128:
            return str(address)
        network = ipaddress.IPv6Network((address, self.ipv6_prefix), strict=False)
        return f"{network.network_address}/{self.ipv6_prefix}"


def client_address(options: Mapping[str, Any]) -> ClientAddress:
    """The ``ClientAddress`` of the web core's options (``trusted_proxies``,
    ``ipv6_prefix``, ``forwarded_header``, ``trusted_hops``): how every integration finds
    a request's client."""
    return ClientAddress(
        Networks(options.get("trusted_proxies"), what="trusted_proxies"),
        options.get("ipv6_prefix", 64),
        options.get("forwarded_header", "x-forwarded-for"),
        options.get("trusted_hops", 1),
    )
