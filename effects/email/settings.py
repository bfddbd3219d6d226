"""`[integrations.email]`, checked: the server and its security, the sender, the
recipient domains allowed, the login (the password resolved), the limits."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.headerregistry import Address
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from broker.clock import parse_duration
from broker.errors import ConfigError, InvalidParams
from effects import kv
from effects.email.addresses import parse_mailbox

SECURITY_PORTS = {"starttls": 587, "ssl": 465, "none": 25}
Secret = Callable[[str], str | None]


@dataclass(frozen=True)
class EmailSettings:
    """`[integrations.email]`, checked, the password resolved."""

    host: str
    port: int
    security: str
    sender: Address
    allow_domains: tuple[str, ...]
    username: str | None = None
    password: str | None = None
    max_recipients: int = 20
    timeout: float = 30.0
    helo: str | None = None
    ca_file: str | None = None

    def allows(self, domain: str) -> bool:
        return any(fnmatchcase(domain.lower(), pattern) for pattern in self.allow_domains)

    @property
    def server(self) -> str:
        return f"{self.host}:{self.port} ({self.security})"


def settings_from(table: Mapping[str, Any], secret: Secret | None = None) -> EmailSettings:
    """Parse and check `[integrations.email]`; a fault names the key. The password comes
    from `secret` (`ctx.secret`), else resolves in `table` as at start."""
    where = "integrations.email"
    host, port, security = _server(table, where)
    sender, domains = _sender(table, where), _domains(table, where)
    username, password = _login(table, where, security, secret or kv.static(table, where))
    max_recipients = table.get("max_recipients", 20)
    if (
        not isinstance(max_recipients, int)
        or isinstance(max_recipients, bool)
        or max_recipients < 1
    ):
        raise ConfigError(f"{where}.max_recipients: a whole number >= 1")
    try:
        timeout = parse_duration(table.get("timeout", "30s"))
    except ValueError as exc:
        raise ConfigError(f"{where}.timeout: {exc}") from exc
    if table.get("helo") is not None and not isinstance(table["helo"], str):
        raise ConfigError(f"{where}.helo: expected a host name")
    ca_file = table.get("ca_file")
    if ca_file is not None and (not isinstance(ca_file, str) or not Path(ca_file).is_file()):
        raise ConfigError(
            f"{where}.ca_file: {ca_file!r} is not a readable file of PEM certificates"
        )
    return EmailSettings(
        host=host,
        port=port,
        security=security,
        sender=sender,
        allow_domains=domains,
        username=username,
        password=password,
        max_recipients=max_recipients,
        timeout=timeout,
        helo=table.get("helo"),
        ca_file=ca_file,
    )


def _server(table: Mapping[str, Any], where: str) -> tuple[str, int, str]:
    host = table.get("host")
    if not isinstance(host, str) or not host:
        raise ConfigError(f"{where}.host: required, the SMTP server's host name")
    security = table.get("security", "starttls")
    if security not in SECURITY_PORTS:
        raise ConfigError(f"{where}.security: starttls, ssl or none; got {security!r}")
    port = table.get("port", SECURITY_PORTS[security])
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ConfigError(f"{where}.port: a port number, got {port!r}")
    return host, port, security


def _sender(table: Mapping[str, Any], where: str) -> Address:
    sender_text = table.get("from")
    if not isinstance(sender_text, str):
        raise ConfigError(f'{where}.from: required, e.g. "Agent <agent@example.com>"')
    try:
        return parse_mailbox(sender_text, "from")
    except InvalidParams as exc:
        raise ConfigError(f"{where}.from: {exc.issues[0].message}") from exc


def _domains(table: Mapping[str, Any], where: str) -> tuple[str, ...]:
    domains = table.get("allow_domains")
    if (
        not isinstance(domains, list)
        or not domains
        or not all(isinstance(d, str) and d for d in domains)
    ):
        raise ConfigError(
            f'{where}.allow_domains: required, recipient domains such as ["example.com", '
            '"*.example.com"]; ["*"] allows any'
        )
    return tuple(d.lower() for d in domains)


def _login(
    table: Mapping[str, Any], where: str, security: str, secret: Secret
) -> tuple[str | None, str | None]:
    username = table.get("username")
    if username is not None and not isinstance(username, str):
        raise ConfigError(f"{where}.username: expected a string")
    password = secret("password")
    if password is not None and username is None:
        raise ConfigError(f"{where}.username: required when a password is set")
    if password is not None and security == "none":
        raise ConfigError(
            f"{where}.security: 'none' would send the SMTP password in clear; use starttls or ssl"
        )
    return username, password
