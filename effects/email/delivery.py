"""Delivery through the host's SMTP server: connect (TLS verified), log in, send, and
say goodbye. smtplib's and the socket's exceptions pass through to `errors`."""

from __future__ import annotations

import smtplib
import ssl
from email.message import EmailMessage

from effects.email.settings import EmailSettings


def send(
    msg: EmailMessage, settings: EmailSettings, recipients: list[str]
) -> dict[str, tuple[int, bytes]]:
    """Send `msg` to `recipients`; the recipients the server refused, with its answer."""
    smtp = connect(settings)
    try:
        return smtp.send_message(msg, from_addr=settings.sender.addr_spec, to_addrs=recipients)
    finally:
        _quit(smtp)


def connect(settings: EmailSettings) -> smtplib.SMTP:
    """A connection to the server, TLS verified and logged in; closed if either fails."""
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


def reply_text(reply: bytes | str) -> str:
    """An SMTP reply as text (smtplib gives bytes)."""
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply
