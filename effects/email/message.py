"""The message exactly as it is sent: the envelope checked against the allowlist, the
headers (a `Message-ID` stable for one request), the text and HTML parts."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime

from broker.errors import InvalidParams
from broker.typing import Params
from effects.base import Context
from effects.email.addresses import parse_mailbox
from effects.email.headers import STRICT_SMTP, check_header_text
from effects.email.settings import EmailSettings


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


def envelope(params: Params, settings: EmailSettings) -> Envelope:
    """Parse every address; refuse a domain the host does not allow, and header text
    that could fold a line of its own into the headers."""
    if "text" not in params and "html" not in params:
        raise InvalidParams("/params/text", "give text, html or both", "no_body")
    check_header_text(params["subject"], "/params/subject", "the subject")
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
    params: Params, settings: EmailSettings, env: Envelope, ctx: Context, when: datetime
) -> EmailMessage:
    """The message exactly as it is sent (Bcc goes in the envelope only)."""
    msg = EmailMessage(policy=STRICT_SMTP)
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
