"""smtplib's and the socket's exceptions → EffectFailed: a sentence the agent can act
on, naming the server, never holding the password."""

from __future__ import annotations

import smtplib
import socket
import ssl

from broker.errors import EffectFailed
from effects.email.delivery import reply_text
from effects.email.settings import EmailSettings


def _answer(exc: smtplib.SMTPResponseException) -> str:
    return f"{exc.smtp_code} {reply_text(exc.smtp_error)}".strip()


def _smtp_reason(exc: BaseException, s: EmailSettings) -> str:
    """What went wrong, most specific class first, as a sentence for the agent."""
    server = f"the SMTP server {s.host}:{s.port}"
    # SMTPException is an OSError: what the server said is read before what the network did
    if isinstance(exc, smtplib.SMTPException):
        return _protocol_reason(exc, server)
    return _network_reason(exc, server, s.host)


def _protocol_reason(exc: smtplib.SMTPException, server: str) -> str:
    """What the SMTP conversation went wrong on."""
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
                f"{rcpt}: {code} {reply_text(reply)}"
                for rcpt, (code, reply) in exc.recipients.items()
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
        case _:
            return f"SMTP with {server} failed ({exc})"


def _network_reason(exc: BaseException, server: str, host: str) -> str:
    """What TLS, the resolver or the connection went wrong on."""
    match exc:
        case ssl.SSLCertVerificationError():
            detail = getattr(exc, "verify_message", None) or exc
            return f"{server}'s TLS certificate could not be verified ({detail}); tell the operator"
        case ssl.SSLError():
            detail = getattr(exc, "reason", None) or exc
            return f"TLS with {server} failed ({detail}); tell the operator"
        case socket.gaierror():
            return f"cannot resolve {host} ({exc.strerror}); tell the operator"
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


def smtp_failure(exc: BaseException, settings: EmailSettings) -> EffectFailed:
    """The EffectFailed for an smtplib or socket error; never holds the password."""
    reason = _smtp_reason(exc, settings)
    if settings.password:
        reason = reason.replace(settings.password, "•••")
    return EffectFailed(f"failed: {reason}")
