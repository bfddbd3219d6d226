"""The guard itself: `NetGuard` resolves a name once and checks every address, and the
transport built on it connects only to those checked addresses (TLS still verifies,
and SNI and `Host` still carry, the name in the URL)."""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpcore
import httpx

from broker.errors import ConfigError
from broker.masking import quiet_http_libraries
from effects.netguard.addresses import (
    IPAddress,
    IPNetwork,
    Resolver,
    effective,
    refusal,
    shown,
    system_resolver,
)
from effects.netguard.errors import DestinationRefused
from effects.netguard.urls import numeric_form

USER_AGENT = "sandbox-outbox-broker"


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
            if numeric_form(host) is not None:
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
    quiet_http_libraries()  # httpx would log every URL, a secret webhook's too, at INFO
    return httpx.Client(
        transport=transport,
        trust_env=False,
        follow_redirects=False,
        headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
    )
