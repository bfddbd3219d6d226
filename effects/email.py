"""email.send: one message through the host's SMTP server, to allowlisted domains.

Settings, `[integrations.email]`:

    host = "smtp.example.com"           # required
    port = 587                          # default: 587 starttls, 465 ssl, 25 none
    security = "starttls"               # starttls | ssl | none (none: no password allowed)
    username = "agent@example.com"      # optional; with password_env or password_file
    password_env = "SMTP_PASSWORD"
    from = "Agent <agent@example.com>"  # required; the agent cannot choose the sender
    allow_domains = ["example.com", "*.example.org"]   # required; ["*"] allows any
    max_recipients = 20
    timeout = "30s"
    helo = "broker.example.com"         # optional; default: this host's name
    ca_file = "/etc/ssl/internal.pem"   # optional extra CA for the server's certificate

The `Message-ID` is derived from the sandbox, the request id and its sha256, so a
message sent again for the same request is recognisably the same message.
"""

from __future__ import annotations

import email.policy
import hashlib
import re
import smtplib
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, ClassVar

from broker.clock import parse_duration
from broker.config import resolve_secret
from broker.errors import ConfigError, EffectFailed, InvalidParams
from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context, Handler

SECURITY_PORTS = {"starttls": 587, "ssl": 465, "none": 25}
_LOCAL = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_ADDR_SPEC = re.compile(rf"(?P<local>{_LOCAL})@(?P<domain>{_LABEL}(?:\.{_LABEL})+)")
_NAME_ADDR = re.compile(r"(?P<name>[^<>\x00-\x1f]*?)\s*<(?P<spec>[^<>]*)>")


def parse_mailbox(text: str, where: str) -> Address:
    """'jane@example.com' or 'Jane Doe <jane@example.com>'; nothing looser."""
    text = text.strip()
    named = _NAME_ADDR.fullmatch(text)
    name, spec = (
        (named.group("name").strip().strip('"'), named.group("spec")) if named else ("", text)
    )
    match = _ADDR_SPEC.fullmatch(spec)
    if match is None:
        raise InvalidParams(
            where,
            f"{text!r} is not an address like jane@example.com or 'Jane Doe <jane@example.com>'",
            "bad_address",
        )
    local, domain = match.group("local"), match.group("domain")
    try:
        return Address(display_name=name, username=local, domain=domain.lower())
    except Exception as exc:  # the email package raises several types for one problem
        raise InvalidParams(
            where, f"{text!r} is not a valid address: {exc}", "bad_address"
        ) from exc


@dataclass(frozen=True)
class Settings:
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


def settings_from(table: Mapping[str, Any]) -> Settings:
    """Parse and check `[integrations.email]`; a fault names the key."""
    where = "integrations.email"
    host = table.get("host")
    if not isinstance(host, str) or not host:
        raise ConfigError(f"{where}.host: required, the SMTP server's host name")
    security = table.get("security", "starttls")
    if security not in SECURITY_PORTS:
        raise ConfigError(f"{where}.security: starttls, ssl or none; got {security!r}")
    port = table.get("port", SECURITY_PORTS[security])
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ConfigError(f"{where}.port: a port number, got {port!r}")
    sender_text = table.get("from")
    if not isinstance(sender_text, str):
        raise ConfigError(f'{where}.from: required, e.g. "Agent <agent@example.com>"')
    try:
        sender = parse_mailbox(sender_text, "from")
    except InvalidParams as exc:
        raise ConfigError(f"{where}.from: {exc.issues[0].message}") from exc
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
    username = table.get("username")
    if username is not None and not isinstance(username, str):
        raise ConfigError(f"{where}.username: expected a string")
    password = resolve_secret(table, "password", where)
    if password is not None and username is None:
        raise ConfigError(f"{where}.username: required when a password is set")
    if password is not None and security == "none":
        raise ConfigError(
            f"{where}.security: 'none' would send the SMTP password in clear; use starttls or ssl"
        )
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
    return Settings(
        host=host,
        port=port,
        security=security,
        sender=sender,
        allow_domains=tuple(d.lower() for d in domains),
        username=username,
        password=password,
        max_recipients=max_recipients,
        timeout=timeout,
        helo=table.get("helo"),
        ca_file=ca_file,
    )


@dataclass(frozen=True)
class Envelope:
    """The recipients, by role, checked against the allowlist."""

    to: tuple[Address, ...]
    cc: tuple[Address, ...]
    bcc: tuple[Address, ...]
    reply_to: Address | None

    @property
    def recipients(self) -> list[str]:
        return list(dict.fromkeys(a.addr_spec for a in (*self.to, *self.cc, *self.bcc)))


def envelope(params: Params, settings: Settings) -> Envelope:
    """Parse every address; refuse a domain the host does not allow."""
    if "text" not in params and "html" not in params:
        raise InvalidParams("/params/text", "give text, html or both", "no_body")
    roles: dict[str, tuple[Address, ...]] = {}
    for role in ("to", "cc", "bcc"):
        found = []
        for i, text in enumerate(params.get(role, [])):
            where = f"/params/{role}/{i}"
            address = parse_mailbox(text, where)
            if not settings.allows(address.domain):
                raise InvalidParams(
                    where,
                    f"{address.addr_spec}: the domain {address.domain} is not allowed on this "
                    f"host (allowed: {', '.join(settings.allow_domains)})",
                    "domain_not_allowed",
                )
            found.append(address)
        roles[role] = tuple(found)
    result = Envelope(
        roles["to"],
        roles["cc"],
        roles["bcc"],
        parse_mailbox(params["reply_to"], "/params/reply_to") if "reply_to" in params else None,
    )
    if len(result.recipients) > settings.max_recipients:
        raise InvalidParams(
            "/params/to",
            f"{len(result.recipients)} recipients; this host allows at most "
            f"{settings.max_recipients} per message",
            "too_many_recipients",
        )
    return result


def message_id(ctx: Context, sender: Address) -> str:
    """Stable for one request in one sandbox: a retry is recognisably the same message."""
    seed = f"{ctx.sandbox}\n{ctx.request_id}\n{ctx.request_sha256}".encode()
    return f"<broker.{hashlib.sha256(seed).hexdigest()[:40]}@{sender.domain}>"


def build_message(
    params: Params, settings: Settings, env: Envelope, ctx: Context, when: datetime
) -> EmailMessage:
    """The message exactly as it is sent (Bcc goes in the envelope only)."""
    msg = EmailMessage(policy=email.policy.SMTP)
    msg["From"] = settings.sender
    msg["To"] = env.to
    if env.cc:
        msg["Cc"] = env.cc
    if env.reply_to is not None:
        msg["Reply-To"] = env.reply_to
    msg["Subject"] = params["subject"]
    msg["Date"] = format_datetime(when)
    msg["Message-ID"] = message_id(ctx, settings.sender)
    text: str | None = params.get("text")
    html: str | None = params.get("html")
    if text is not None:
        msg.set_content(text, subtype="plain", cte=_cte(text))
    if html is not None and text is None:
        msg.set_content(html, subtype="html", cte=_cte(html))
    elif html is not None:
        msg.add_alternative(html, subtype="html", cte=_cte(html))
        msg.set_boundary(f"==broker-{message_id(ctx, settings.sender)[8:32]}==")
    return msg


def _cte(text: str) -> str:
    """Readable in the preview: 7bit for ASCII, quoted-printable otherwise."""
    fits = text.isascii() and all(len(line) <= 998 for line in text.splitlines())
    return "7bit" if fits else "quoted-printable"


class EmailSend(Handler):
    """Send one message through the host's SMTP server."""

    name = "email.send"
    reversible = False
    idempotent = False
    undo = "an email cannot be unsent"
    config_keys: ClassVar[frozenset[str]] = frozenset(
        {
            "host",
            "port",
            "security",
            "username",
            "password_env",
            "password_file",
            "from",
            "allow_domains",
            "max_recipients",
            "timeout",
            "helo",
            "ca_file",
        }
    )

    def check_config(self, settings: Mapping[str, Any]) -> None:
        super().check_config(settings)
        if settings:
            settings_from(settings)

    @staticmethod
    def _settings(ctx: Context) -> Settings:
        if not ctx.settings:
            raise EffectFailed(
                "failed: email.send is not configured on this host ([integrations.email])"
            )
        try:
            return settings_from(ctx.settings)
        except ConfigError as exc:
            raise EffectFailed(
                f"failed: email.send is misconfigured on this host ({exc}); tell the operator"
            ) from exc

    def check(self, params: Params, ctx: Context) -> None:
        envelope(params, self._settings(ctx))

    def preview(self, params: Params, ctx: Context) -> Preview:
        settings = self._settings(ctx)
        env = envelope(params, settings)
        msg = build_message(params, settings, env, ctx, datetime.now(UTC))
        wire = msg.as_bytes()
        bcc = ", ".join(a.addr_spec for a in env.bcc) or "none"
        return Preview(
            title=f"send email {params['subject']!r} to {len(env.recipients)} recipient(s)",
            target=f"email: {settings.server}",
            body=wire.decode("ascii", errors="replace").replace("\r\n", "\n"),
            body_kind="text",
            facts=(
                ("from", str(settings.sender)),
                ("recipients", ", ".join(env.recipients)),
                ("bcc (envelope only, not in the headers)", bcc),
                ("message-id", str(msg["Message-ID"])),
                ("server", settings.server),
                ("size", f"{len(wire)} bytes"),
                ("date", "set again when the message is sent"),
            ),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        settings = self._settings(ctx)
        env = envelope(params, settings)
        msg = build_message(params, settings, env, ctx, datetime.now(UTC))
        try:
            smtp = self._connect(settings)
            try:
                refused = smtp.send_message(
                    msg, from_addr=settings.sender.addr_spec, to_addrs=env.recipients
                )
            finally:
                _quit(smtp)
        except (smtplib.SMTPException, OSError) as exc:
            raise smtp_failure(exc, settings) from exc
        return {
            "message_id": str(msg["Message-ID"]),
            "from": settings.sender.addr_spec,
            "accepted": [r for r in env.recipients if r not in refused],
            "refused": {r: f"{code} {_text(reply)}" for r, (code, reply) in refused.items()},
        }

    @staticmethod
    def _connect(settings: Settings) -> smtplib.SMTP:
        context = ssl.create_default_context()
        if settings.ca_file:
            context.load_verify_locations(cafile=settings.ca_file)
        smtp: smtplib.SMTP
        if settings.security == "ssl":
            smtp = smtplib.SMTP_SSL(
                settings.host,
                settings.port,
                local_hostname=settings.helo,
                timeout=settings.timeout,
                context=context,
            )
        else:
            smtp = smtplib.SMTP(
                settings.host, settings.port, local_hostname=settings.helo, timeout=settings.timeout
            )
        try:
            if settings.security == "starttls":
                smtp.starttls(context=context)
            if settings.username is not None and settings.password is not None:
                smtp.login(settings.username, settings.password)
        except BaseException:
            smtp.close()
            raise
        return smtp


def _quit(smtp: smtplib.SMTP) -> None:
    """Say goodbye; once the message is accepted, a failed QUIT changes nothing."""
    try:
        smtp.quit()
    except (smtplib.SMTPException, OSError):
        smtp.close()


def _text(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply


def _answer(exc: smtplib.SMTPResponseException) -> str:
    return f"{exc.smtp_code} {_text(exc.smtp_error)}".strip()


def _smtp_reason(exc: BaseException, s: Settings) -> str:
    """What went wrong, most specific class first, as a sentence for the agent."""
    server = f"the SMTP server {s.host}:{s.port}"
    match exc:
        case smtplib.SMTPAuthenticationError():
            return f"{server} refused the broker's login ({_answer(exc)}); tell the operator"
        case smtplib.SMTPSenderRefused():
            return f"{server} refused the sender {exc.sender} ({_answer(exc)}); tell the operator"
        case smtplib.SMTPDataError():
            return (
                f"{server} refused the message ({_answer(exc)}); check its size and content, "
                "then send a new request"
            )
        case smtplib.SMTPConnectError():
            return f"{server} refused the connection ({_answer(exc)}); try again later"
        case smtplib.SMTPHeloError():
            return f"{server} refused the broker's greeting ({_answer(exc)}); tell the operator"
        case smtplib.SMTPResponseException():
            return f"{server} answered {_answer(exc)}"
        case smtplib.SMTPRecipientsRefused():
            refused = "; ".join(
                f"{rcpt}: {code} {_text(reply)}" for rcpt, (code, reply) in exc.recipients.items()
            )
            return f"{server} refused every recipient ({refused}); check the addresses"
        case smtplib.SMTPNotSupportedError():
            return (
                f"{server} does not support what the broker needs ({exc}); the operator must "
                "change [integrations.email] security"
            )
        case smtplib.SMTPServerDisconnected():
            return (
                f"{server} closed the connection early ({exc or 'no reason given'}); the "
                "message was probably not sent: try again later"
            )
        case smtplib.SMTPException():
            return f"SMTP with {server} failed ({exc})"
        case ssl.SSLCertVerificationError():
            detail = getattr(exc, "verify_message", None) or exc
            return f"{server}'s TLS certificate could not be verified ({detail}); tell the operator"
        case ssl.SSLError():
            detail = getattr(exc, "reason", None) or exc
            return f"TLS with {server} failed ({detail}); tell the operator"
        case socket.gaierror():
            return f"cannot resolve {s.host} ({exc.strerror}); tell the operator"
        case TimeoutError():
            return (
                f"{server} did not answer in time; the message may or may not have been "
                "accepted: check before sending it again"
            )
        case ConnectionRefusedError():
            return f"{server} refused the connection; try again later"
        case ConnectionError():
            return f"the connection to {server} broke ({exc.strerror or exc}); try again later"
        case _:
            detail = getattr(exc, "strerror", None) or exc
            return f"could not talk to {server} ({detail}); try again later"


def smtp_failure(exc: BaseException, settings: Settings) -> EffectFailed:
    """The EffectFailed for an smtplib or socket error; never holds the password."""
    reason = _smtp_reason(exc, settings)
    if settings.password:
        reason = reason.replace(settings.password, "•••")
    return EffectFailed(f"failed: {reason}")
