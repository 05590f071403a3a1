"""The client's address: the TCP peer, or what trusted proxies say the client was.

``Forwarded`` (RFC 7239) and ``X-Forwarded-For`` are read only when the peer itself is a
trusted proxy: anyone else can write those headers. The addresses are walked right to
left (the nearest hop first), skipping trusted proxies; the first address that is not a
trusted proxy is the client. A client that sends its own ``X-Forwarded-For: 1.2.3.4``
through a trusted proxy is therefore seen at the address the proxy appended, never at
the one it made up. When every hop is trusted, the leftmost one is the client.

IPv6 clients are grouped by prefix (``/64`` by default: one subscriber usually owns a
whole /64, and limiting single addresses in it limits nothing); IPv4 addresses are kept
whole. An IPv4-mapped IPv6 address (``::ffff:192.0.2.1``) counts as its IPv4 address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ratekeeper.errors import ConfigurationError

__all__ = ["ClientAddress", "Networks", "forwarded_for", "parse_ip", "x_forwarded_for"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


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


def forwarded_for(values: str) -> list[str]:
    """The ``for=`` node of each element of a ``Forwarded`` header, in order (RFC 7239 §4)."""
    nodes: list[str] = []
    for element in _split_outside_quotes(values, ","):
        node = ""
        for pair in _split_outside_quotes(element, ";"):
            name, eq, value = pair.partition("=")
            if eq and name.strip().lower() == "for":
                node = value.strip().strip('"')
        nodes.append(node)
    return nodes


def x_forwarded_for(values: str) -> list[str]:
    """The addresses of an ``X-Forwarded-For`` header, in order."""
    return [v.strip() for v in values.split(",")]


def _split_outside_quotes(text: str, sep: str) -> list[str]:
    out: list[str] = []
    buf: list[str] = []
    quoted = False
    escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\" and quoted:
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            out.append("".join(buf))
            buf = []
            continue
        buf.append(ch)
    out.append("".join(buf))
    return out


MEMO_SIZE = 65_536
"""How many (peer, Forwarded, X-Forwarded-For) answers ``ClientAddress`` keeps."""


@dataclass(frozen=True, slots=True)
class ClientAddress:
    """How to find the client: which proxies to believe, and how to group IPv6 addresses."""

    trusted_proxies: Networks
    ipv6_prefix: int = 64
    _memo: dict[tuple[str | None, str | None, str | None], tuple[IPAddress | None, str | None]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _peers: dict[str | None, tuple[bool, tuple[IPAddress | None, str | None]]] = field(
        default_factory=dict, compare=False, repr=False
    )
    """Per peer: whether it is a trusted proxy, and the answer when it is not."""

    def __post_init__(self) -> None:
        if type(self.ipv6_prefix) is not int or not 0 <= self.ipv6_prefix <= 128:
            raise ConfigurationError(f"ipv6_prefix must be an integer from 0 to 128, got {self.ipv6_prefix!r}")

    def resolve(
        self, peer: str | None, forwarded: str | Callable[[], str | None] | None, x_forwarded: Any = None
    ) -> tuple[IPAddress | None, str | None]:
        """``find`` remembered: parsing addresses costs more than the rest of a request's key,
        and a server sees the same few peers (and proxy chains) again and again. The
        forwarding headers may be given as callables (``lambda: headers.get(...)``): they
        are read only when the peer is a trusted proxy. Bounded: each memo starts afresh at
        ``MEMO_SIZE`` entries."""
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
        given = (
            peer,
            forwarded() if callable(forwarded) else forwarded,
            x_forwarded() if callable(x_forwarded) else x_forwarded,
        )
        memo = self._memo
        found = memo.get(given)
        if found is None:
            found = self.find(*given)
            if len(memo) >= MEMO_SIZE:
                memo.clear()
            memo[given] = found
        return found

    def find(
        self, peer: str | None, forwarded: str | None, x_forwarded: str | None
    ) -> tuple[IPAddress | None, str | None]:
        """(the client's address when it is one, the client as a key part) for one request.

        The key part is the address (IPv6 grouped: ``2001:db8:1:2::/64``), or a
        proxy's opaque token (``_hidden``) when that is all it gave; None when the client
        is unknown (no peer, or a trusted proxy saying ``unknown``).
        """
        address = parse_ip(peer)
        if address is None:
            return None, peer or None
        if address not in self.trusted_proxies:
            return address, self.group(address)
        hops = forwarded_for(forwarded) if forwarded else x_forwarded_for(x_forwarded) if x_forwarded else []
        client: IPAddress = address
        for hop in reversed(hops):
            hop_address = parse_ip(hop)
            if hop_address is None:
                # An opaque identifier or "unknown" from the hop we trust: that is all we know.
                token = hop.strip()
                return None, (token if token and token.lower() != "unknown" else None)
            client = hop_address
            if hop_address not in self.trusted_proxies:
                break
        return client, self.group(client)

    def group(self, address: IPAddress) -> str:
        """The key part of ``address``: IPv4 as is, IPv6 as its ``/ipv6_prefix`` network."""
        if isinstance(address, ipaddress.IPv4Address) or self.ipv6_prefix == 128:
            return str(address)
        network = ipaddress.IPv6Network((address, self.ipv6_prefix), strict=False)
        return f"{network.network_address}/{self.ipv6_prefix}"
