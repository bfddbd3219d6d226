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


# %XX of an unreserved character (RFC 3986 2.3): the same URL either way, so decoded
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_~")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
# a server may decode these and climb above a path or step around a rule
ENCODED_SEPARATORS = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)


def canonical_path(path: str, where: str) -> str:
    """A URL path in its one form: `//` and `.` segments dropped, unreserved `%XX`
    decoded and the rest upper-cased; an encoded '.', '/' or '\\' is refused."""
    if ENCODED_SEPARATORS.search(path):
        raise InvalidParams(
            where,
            "the path holds an encoded '.', '/' or '\\' (%2e, %2f, %5c), which a server may "
            "read as a path step; write the path plainly",
            "bad_path",
        )

    def one(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        return char if char in _UNRESERVED else f"%{match.group(1).upper()}"

    parts = [p for p in path.split("/") if p not in ("", ".")]
    tail = "/" if path.endswith(("/", "/.")) and parts else ""
    return _PERCENT.sub(one, "/" + "/".join(parts) + tail)


def canonical_url(text: str, where: str = "/params/url") -> str:
    """An http(s) URL in its one form, as policy rules match it and the preview shows
    it: scheme and host in lower case (IDNA for a Unicode host, no trailing dot), no
    default port, dot segments resolved, `canonical_path`, no fragment (never sent)."""
    url = parse_url(text, where)
    if ENCODED_SEPARATORS.search(text.split("?", 1)[0].split("#", 1)[0]):
        canonical_path("%2e", where)  # refused, with the same sentence
    host = url.raw_host.decode("ascii").rstrip(".").lower()
    if ":" in host:
        host = f"[{host}]"
    port = "" if url.port in (None, default_port(url.copy_with(port=None))) else f":{url.port}"
    path, _, query = url.raw_path.decode("ascii").partition("?")
    shown = f"{url.scheme}://{host}{port}{canonical_path(path, where)}"
    if query:
        shown += f"?{query}"
    parse_url(shown, where)
    return shown
