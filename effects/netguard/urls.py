"""URLs the guard can reason about: checked before anything is sent (http/https only,
no user-info, IPv4 only as a.b.c.d), and compared by origin."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable

import httpx

from broker.errors import InvalidParams
from effects.netguard.addresses import IPNetwork, refusal

SCHEMES = ("http", "https")
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)", re.IGNORECASE)


def numeric_form(host: str) -> str | None:
    """For an IPv4 address written other than as a.b.c.d, what it reads as."""
    labels = host.rstrip(".").split(".")
    if ":" in host or not _NUMERIC_LABEL.fullmatch(labels[-1]):
        return None
    try:
        ipaddress.IPv4Address(host)
        return None  # the one standard form
    except ValueError:
        pass
    try:
        return socket.inet_ntoa(socket.inet_aton(host.rstrip(".")))
    except OSError:
        return "no address at all"


def parse_url(text: str, where: str = "/params/url") -> httpx.URL:
    """An http(s) URL the guard can reason about, or InvalidParams saying what to fix."""
    if any(ord(c) < 33 or c == "\\" for c in text):
        raise InvalidParams(where, "the URL holds spaces, control characters or '\\'", "bad_url")
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise InvalidParams(where, f"not a valid URL: {exc}", "bad_url") from exc
    if url.scheme not in SCHEMES:
        raise InvalidParams(
            where, f"only http and https URLs are allowed, not {url.scheme or 'none'!r}", "bad_url"
        )
    if url.userinfo:
        raise InvalidParams(
            where,
            "the URL holds user-info ('user@host'); the broker never sends credentials from "
            "a request: name a configured destination instead",
            "bad_url",
        )
    if not url.host:
        raise InvalidParams(where, "the URL has no host", "bad_url")
    read_as = numeric_form(url.host)
    if read_as is not None:
        raise InvalidParams(
            where,
            f"the host {url.host!r} is an IPv4 address in a non-standard form (read as "
            f"{read_as}); write IPv4 addresses as four decimal numbers, a.b.c.d",
            "bad_host",
        )
    return url


def default_port(url: httpx.URL) -> int:
    return url.port or (443 if url.scheme == "https" else 80)


def same_origin(a: httpx.URL, b: httpx.URL) -> bool:
    return (a.scheme, a.host, default_port(a)) == (b.scheme, b.host, default_port(b))


def check_literal(url: httpx.URL, allow: Iterable[IPNetwork], where: str = "/params/url") -> None:
    """Refuse, before anything happens, a URL whose host is a forbidden IP address."""
    try:
        ip = ipaddress.ip_address(url.host)
    except ValueError:
        return
    why = refusal(ip, allow)
    if why is not None:
        raise InvalidParams(
            where,
            f"refused: {url.host} is {why}; the broker only reaches public addresses unless "
            "the host's configuration allows that network (allow_networks)",
            "refused_address",
        )
