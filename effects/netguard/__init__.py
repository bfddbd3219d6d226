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

Modules, one per concern:

    addresses  which addresses are refused, `allow_networks`, the resolver
    urls       URLs checked before anything is sent; origins compared
    guard      `NetGuard`, and the transport that connects only to checked addresses
    replies    a response read no further than the caps allow
    headers    plain and secret headers from broker.toml; secrets masked
    errors     the guard's refusal; httpx's exceptions → EffectFailed
    allowed    what of a response returns to the sandbox (`response = ...`)
"""

from __future__ import annotations

from effects.netguard.addresses import (
    IPAddress,
    IPNetwork,
    Resolver,
    effective,
    parse_networks,
    refusal,
    shown,
    system_resolver,
)
from effects.netguard.allowed import Allowed, parse_allowed
from effects.netguard.errors import _HTTPX_REASONS as _HTTPX_REASONS  # checked complete by tests
from effects.netguard.errors import HTTPX_ERRORS, DestinationRefused, http_failure
from effects.netguard.guard import (
    USER_AGENT,
    GuardedBackend,
    GuardedTransport,
    NetGuard,
    check_ca_file,
    client,
    tls_context,
)
from effects.netguard.headers import MASK, Headers, Secret, parse_headers, scrub, scrub_bytes
from effects.netguard.replies import Reply, read_capped
from effects.netguard.urls import SCHEMES, check_literal, default_port, parse_url, same_origin

__all__ = [
    "HTTPX_ERRORS",
    "MASK",
    "SCHEMES",
    "USER_AGENT",
    "Allowed",
    "DestinationRefused",
    "GuardedBackend",
    "GuardedTransport",
    "Headers",
    "IPAddress",
    "IPNetwork",
    "NetGuard",
    "Reply",
    "Resolver",
    "Secret",
    "check_ca_file",
    "check_literal",
    "client",
    "default_port",
    "effective",
    "http_failure",
    "parse_allowed",
    "parse_headers",
    "parse_networks",
    "parse_url",
    "read_capped",
    "refusal",
    "same_origin",
    "scrub",
    "scrub_bytes",
    "shown",
    "system_resolver",
    "tls_context",
]
