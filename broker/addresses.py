"""Listen addresses as operators write them: parsed without a lookup, loopback checked.

host, port = parse_listen("localhost:8700")          # ("127.0.0.1", 8700), never resolved
check_listen(host, tls=False, insecure=False)        # ConfigError unless loopback
"""

from __future__ import annotations

import ipaddress

from broker.errors import ConfigError


def parse_listen(text: str) -> tuple[str, int]:
    """'127.0.0.1:8700', '[::1]:8700' or 'localhost:8700' → (host, port). `localhost` is
    taken to mean 127.0.0.1 and never resolved: /etc/hosts (or DNS) could name another
    address, and the loopback check must hold for the address actually bound."""
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8700")
    if host.lower() == "localhost":
        host = "127.0.0.1"
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address, read as written (a name is never resolved)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(host: str, *, tls: bool, insecure: bool) -> None:
    """Refuse a non-loopback address without TLS unless told --insecure-listen."""
    if is_loopback(host) or tls or insecure:
        return
    raise ConfigError(
        f"--listen {host}: not a loopback address, and no TLS is configured "
        "([web] tls_certfile and tls_keyfile); tokens would cross the network in clear "
        "text. Use 127.0.0.1, configure TLS, or pass --insecure-listen (e.g. behind a "
        "TLS-terminating proxy on a private network)"
    )
