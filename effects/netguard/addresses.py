"""Which addresses an effect may connect to: the categories refused, the networks the
host lets through (`allow_networks`), and the resolver that turns names into addresses."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from broker.errors import ConfigError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[str]]
"""(host, port) -> the addresses to connect to; raises OSError when there are none."""

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def system_resolver(host: str, port: int) -> list[str]:
    """The host's resolver, every address of `host` for a TCP connection."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _category(ip: IPAddress) -> str | None:
    """Why `ip` is not a public address, or None when it is one."""
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (cloud metadata services live there)"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_private:
        return "a private-network address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "a site-local address"
    if ip.is_reserved or not ip.is_global:
        return "a reserved, non-public address"
    return None


def _embedded(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address leads to (6to4, Teredo, NAT64, IPv4-compatible)."""
    found = []
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if ip in _NAT64 or (int(ip) >> 32 == 0 and int(ip) > 1):
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def effective(ip: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address is that IPv4 address; others are themselves."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def refusal(ip: IPAddress, allow: Iterable[IPNetwork] = ()) -> str | None:
    """Why the broker must not connect to `ip`, or None when it may."""
    ip = effective(ip)
    if any(ip.version == net.version and ip in net for net in allow):
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        for inner in _embedded(ip):
            inner_why = _category(inner)
            if inner_why is not None:
                return f"{inner_why} ({inner}, embedded in an IPv6 address)"
    return _category(ip)


def shown(ip: IPAddress) -> str:
    """An address as people read it: IPv4-mapped ones keep their dotted quad."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return f"::ffff:{ip.ipv4_mapped}"
    return str(ip)


def parse_networks(value: Any, where: str) -> tuple[IPNetwork, ...]:
    """`allow_networks` from broker.toml: a list of exact networks in CIDR form."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f'{where}: expected a list of networks like ["127.0.0.0/8"]')
    nets = []
    for text in value:
        try:
            net = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            raise ConfigError(f"{where}: {text!r} is not an exact network: {exc}") from exc
        if net.prefixlen == 0:
            raise ConfigError(
                f"{where}: {text!r} would switch the address guard off; list the exact "
                "networks the broker may reach"
            )
        nets.append(net)
    return tuple(nets)
