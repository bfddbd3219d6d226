"""Leaving by the network without being turned against the host (SSRF closed).

Shared by http.request and webhook.post. Every TCP connection an effect makes goes
through `GuardedBackend.connect_tcp`, which:

1. resolves the host name once, with the injectable `Resolver`;
2. refuses the connection if any address is loopback, link-local (169.254.0.0/16,
   where cloud metadata lives), private, multicast, unspecified, reserved, or an IPv6
   form of one of those (IPv4-mapped, 6to4, Teredo, NAT64), unless the host's
   configuration allowlists a network that holds it (`allow_networks`);
3. connects to that checked address, never to the name, so DNS cannot change the
   answer between the check and the use. TLS still verifies, and SNI and `Host` still
   carry, the name in the URL.

Every hop of a redirect is a new connection and so is checked again. URLs are checked
before anything is sent: only `http`/`https`, no user-info, and IPv4 addresses only
as four decimal numbers (`2130706433`, `0x7f000001` and `127.1` are refused, since
parsers disagree about what they mean).
"""

from __future__ import annotations

import codecs
import ipaddress
import re
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpcore
import httpx

from broker.errors import ConfigError, EffectFailed, InvalidParams
from effects.base import Settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[str]]
"""(host, port) -> the addresses to connect to; raises OSError when there are none."""
Secret = Callable[[str], str | None]
"""A settings key -> the secret behind it (`ctx.secret`, or `Settings.secret` at start)."""

MASK = "•••"
SCHEMES = ("http", "https")
USER_AGENT = "sandbox-outbox-broker"
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)", re.IGNORECASE)
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class DestinationRefused(EffectFailed):
    """The broker will not connect there: wrong scheme, odd address form, or an
    address the host does not allow."""


def system_resolver(host: str, port: int) -> list[str]:
    """The host's resolver, every address of `host` for a TCP connection."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# -- addresses ----------------------------------------------------------------------


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


# -- URLs ---------------------------------------------------------------------------


def _numeric_form(host: str) -> str | None:
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
    read_as = _numeric_form(url.host)
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


# -- the guard ----------------------------------------------------------------------


@dataclass(frozen=True)
class NetGuard:
    """Which addresses an effect may connect to, and how names are resolved."""

    allow: tuple[IPNetwork, ...] = ()
    resolver: Resolver = system_resolver

    def addresses(self, host: str, port: int) -> list[str]:
        """The addresses to connect to for `host`, every one of them checked."""
        target = f"{host}:{port}"
        try:
            literal: IPAddress | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            found = [literal]
        else:
            if _numeric_form(host) is not None:
                raise DestinationRefused(
                    f"failed: refused to connect to {host}: an IPv4 address in a non-standard "
                    "form; write it as a.b.c.d"
                )
            try:
                answers = self.resolver(host, port)
                found = [ipaddress.ip_address(a.split("%", 1)[0]) for a in answers]
            except (OSError, UnicodeError, ValueError) as exc:
                raise DestinationRefused(
                    f"failed: cannot resolve {host}: {getattr(exc, 'strerror', None) or exc}; "
                    "check the host name"
                ) from exc
            if not found:
                raise DestinationRefused(f"failed: {host} has no address; check the host name")
        for ip in found:
            why = refusal(ip, self.allow)
            if why is not None:
                via = "" if literal is not None else f" (it resolves to {shown(ip)})"
                raise DestinationRefused(
                    f"failed: refused to connect to {target}{via}: {why}; the broker only "
                    "reaches public addresses unless the host's configuration allows that "
                    "network (allow_networks)"
                )
        return [str(effective(ip)) for ip in found]

    def backend(self, inner: httpcore.NetworkBackend | None = None) -> GuardedBackend:
        return GuardedBackend(self, inner or httpcore.SyncBackend())

    def transport(
        self, *, ca_file: str | None = None, inner: httpcore.NetworkBackend | None = None
    ) -> GuardedTransport:
        return GuardedTransport(self.backend(inner), tls_context(ca_file))


class GuardedBackend(httpcore.NetworkBackend):
    """An httpcore network backend that connects only to checked, pre-resolved addresses."""

    def __init__(self, guard: NetGuard, inner: httpcore.NetworkBackend) -> None:
        self.guard = guard
        self.inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        *others, last = self.guard.addresses(host, port)
        for address in others:
            try:
                return self.inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout):
                continue  # the next checked address of the same name
        return self.inner.connect_tcp(last, port, timeout, local_address, socket_options)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        raise DestinationRefused("failed: effects never connect to local sockets")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class GuardedTransport(httpx.HTTPTransport):
    """httpx's own transport (HTTP/1.1, no proxies, no retries) over a GuardedBackend."""

    def __init__(self, backend: GuardedBackend, context: ssl.SSLContext) -> None:
        super().__init__(verify=context, trust_env=False, retries=0)
        self._pool = httpcore.ConnectionPool(
            ssl_context=context,
            max_connections=4,
            http1=True,
            http2=False,
            retries=0,
            network_backend=backend,
        )


def check_ca_file(value: Any, where: str) -> str | None:
    """A `ca_file` setting: absent, or a readable PEM file."""
    if value is None:
        return None
    if not isinstance(value, str) or not Path(value).is_file():
        raise ConfigError(f"{where}: {value!r} is not a readable file of PEM certificates")
    return value


def tls_context(ca_file: str | None = None) -> ssl.SSLContext:
    """Verifying TLS with the public roots, plus the operator's CA file when given."""
    context = httpx.create_ssl_context(verify=True, trust_env=False)
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


def client(transport: httpx.BaseTransport) -> httpx.Client:
    """A client that sends only what the handler says: no env proxies, no .netrc, no
    cookies kept, no redirects followed behind the handler's back."""
    return httpx.Client(
        transport=transport,
        trust_env=False,
        follow_redirects=False,
        headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
    )


# -- bounded responses --------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """A response read no further than the caps allow."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    truncated: str | None  # None, "size" or "time"
    encoding: str | None

    def text(self) -> str:
        return self.body.decode(self.encoding or "utf-8", errors="replace")


def read_capped(response: httpx.Response, max_bytes: int, deadline: float) -> Reply:
    """Read at most `max_bytes` of the body, stopping at `deadline` (time.monotonic)."""
    chunks: list[bytes] = []
    size = 0
    truncated: str | None = None
    try:
        for chunk in response.iter_bytes():
            if size + len(chunk) > max_bytes:
                chunks.append(chunk[: max_bytes - size])
                size = max_bytes
                truncated = "size"
                break
            chunks.append(chunk)
            size += len(chunk)
            if time.monotonic() > deadline:
                truncated = "time"
                break
    except httpx.TimeoutException:
        truncated = "time"
    finally:
        response.close()
    encoding = response.charset_encoding
    try:
        if encoding:
            codecs.lookup(encoding)
    except LookupError:
        encoding = None
    return Reply(
        status=response.status_code,
        reason=response.reason_phrase,
        headers=[(k, v) for k, v in response.headers.multi_items()],
        body=b"".join(chunks),
        truncated=truncated,
        encoding=encoding,
    )


# -- credentials in headers ---------------------------------------------------------


@dataclass(frozen=True)
class Headers:
    """Headers from broker.toml: plain ones and ones whose values are secrets."""

    plain: Mapping[str, str] = field(default_factory=dict)
    secret: Mapping[str, str] = field(default_factory=dict)
    bare: tuple[str, ...] = ()  # the secrets without their prefixes, to mask echoes

    @property
    def names(self) -> frozenset[str]:
        return frozenset(k.lower() for k in (*self.plain, *self.secret))

    def values(self) -> list[str]:
        return [*self.secret.values(), *self.bare]


_CREDENTIAL_NAME = re.compile(
    r"^(authorization|proxy-authorization|cookie)$|api[-_]?key|token|secret|passw|signature",
    re.IGNORECASE,
)


def parse_headers(table: Mapping[str, Any], where: str, secret: Secret) -> Headers:
    """`headers = {...}` and `secret_headers = {Name = {value_env|value_file, prefix}}`;
    `secret(key)` resolves a key relative to `table` (`secret_headers."X-Key".value`)."""
    plain = table.get("headers", {})
    if not isinstance(plain, Mapping):
        raise ConfigError(f"{where}.headers: expected a table of header names to values")
    for name, value in plain.items():
        _check_header(name, value, f"{where}.headers.{name}")
        if _CREDENTIAL_NAME.search(name):
            raise ConfigError(
                f"{where}.headers.{name}: looks like a credential; put it under "
                f'secret_headers as {{ value_env = "..." }} so it is never written here'
            )
    secrets: dict[str, str] = {}
    bare: list[str] = []
    raw = table.get("secret_headers", {})
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}.secret_headers: expected a table of header names")
    for name, ref in raw.items():
        here = f"{where}.secret_headers.{name}"
        if not isinstance(ref, Mapping):
            raise ConfigError(f'{here}: expected {{ value_env = "VAR" }} or {{ value_file = ... }}')
        extra = set(ref) - {"value_env", "value_file", "prefix"}
        if extra:
            raise ConfigError(f"{here}.{sorted(extra)[0]}: unknown key")
        if ("value_env" in ref) == ("value_file" in ref):
            raise ConfigError(f"{here}: set exactly one of value_env and value_file")
        prefix = ref.get("prefix", "")
        if not isinstance(prefix, str):
            raise ConfigError(f'{here}.prefix: expected a string such as "Bearer "')
        _check_header(name, prefix, f"{here}.prefix")
        if name.lower() in {k.lower() for k in plain}:
            raise ConfigError(f"{here}: also set under headers; keep one")
        value = secret(Settings.key("secret_headers", name, "value"))
        if not value:
            raise ConfigError(f"{here}: the secret is empty")
        if any(c in value for c in "\r\n\x00"):
            raise ConfigError(f"{here}: the secret's value holds a line break")
        secrets[name] = prefix + value
        bare.append(value)
    return Headers(dict(plain), secrets, tuple(bare))


def _check_header(name: Any, value: Any, where: str) -> None:
    if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
        raise ConfigError(f"{where}: {name!r} is not a valid header name")
    if not isinstance(value, str) or any(c in value for c in "\r\n\x00"):
        raise ConfigError(f"{where}: header values are strings without line breaks")


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret (longest first) replaced by •••."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def scrub_bytes(data: bytes, secrets: Iterable[str]) -> bytes:
    """`data` with every secret's UTF-8 bytes (longest first) replaced by •••."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        data = data.replace(secret.encode("utf-8"), MASK.encode("utf-8"))
    return data


# -- translating httpx's errors -----------------------------------------------------

_HTTPX_REASONS: dict[type[Exception], str] = {
    httpx.ConnectTimeout: "{what} did not accept a connection in time; try again later",
    httpx.ConnectError: "could not connect to {what} ({detail}); check the address, or try "
    "again later",
    httpx.ReadTimeout: "{what} did not answer in time; it may have received the request: check "
    "before sending it again, or allow a longer timeout",
    httpx.WriteTimeout: "sending to {what} timed out; try again later",
    httpx.PoolTimeout: "no connection to {what} became free in time; try again later",
    httpx.TimeoutException: "{what} timed out; try again later",
    httpx.ReadError: "the connection to {what} broke while reading the answer ({detail}); it "
    "may have received the request",
    httpx.WriteError: "the connection to {what} broke while sending ({detail}); try again",
    httpx.CloseError: "closing the connection to {what} failed ({detail})",
    httpx.NetworkError: "the network failed talking to {what} ({detail}); try again later",
    httpx.ProxyError: "a proxy refused the request to {what} ({detail})",
    httpx.UnsupportedProtocol: "{what} needs a protocol the broker does not speak; use an "
    "http:// or https:// URL",
    httpx.RemoteProtocolError: "{what} broke the HTTP protocol ({detail})",
    httpx.LocalProtocolError: "the request to {what} could not be sent as valid HTTP ({detail}); "
    "check header names and values",
    httpx.ProtocolError: "an HTTP protocol error with {what} ({detail})",
    httpx.TransportError: "the request to {what} failed in transport ({detail})",
    httpx.DecodingError: "the answer from {what} could not be decoded ({detail})",
    httpx.TooManyRedirects: "{what} redirected too many times",
    httpx.RequestError: "the request to {what} failed ({detail})",
    httpx.HTTPStatusError: "{what} answered with an error status ({detail})",
    httpx.HTTPError: "the request to {what} failed ({detail})",
    httpx.InvalidURL: "the URL for {what} is not valid ({detail}); fix it and send a new request",
    httpx.CookieConflict: "the answer from {what} set conflicting cookies ({detail})",
    httpx.StreamConsumed: "the broker mishandled the request stream to {what}; tell the operator",
    httpx.StreamClosed: "the broker mishandled the response from {what}; tell the operator",
    httpx.ResponseNotRead: "the broker mishandled the response from {what}; tell the operator",
    httpx.RequestNotRead: "the broker mishandled the request to {what}; tell the operator",
    httpx.StreamError: "the broker mishandled a stream to {what}; tell the operator",
    OSError: "a local error on the host while talking to {what} ({detail}); tell the operator",
}
HTTPX_ERRORS = (httpx.HTTPError, httpx.InvalidURL, httpx.CookieConflict, httpx.StreamError)


def http_failure(exc: Exception, what: str, secrets: Iterable[str] = ()) -> EffectFailed:
    """The EffectFailed for an httpx exception: a sentence the agent can act on."""
    template = next(
        (_HTTPX_REASONS[k] for k in type(exc).__mro__ if k in _HTTPX_REASONS),
        "the request to {what} failed ({detail})",
    )
    detail = scrub(str(exc) or type(exc).__name__, secrets)[:300]
    return EffectFailed("failed: " + template.format(what=what, detail=detail))
