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

Modules, one per concern:

    addresses  mailboxes parsed, nothing looser than the two usual forms
    settings   [integrations.email], checked, the password resolved
    message    the envelope against the allowlist; the message exactly as sent
    delivery   connect, TLS, login, send, goodbye
    errors     smtplib's and the socket's exceptions → EffectFailed
    handler    `EmailSend`
"""

from __future__ import annotations

from effects.email.addresses import parse_mailbox
from effects.email.errors import smtp_failure
from effects.email.handler import EmailSend
from effects.email.message import Envelope, build_message, envelope, message_id
from effects.email.settings import SECURITY_PORTS, EmailSettings, settings_from

__all__ = [
    "SECURITY_PORTS",
    "EmailSend",
    "EmailSettings",
    "Envelope",
    "build_message",
    "envelope",
    "message_id",
    "parse_mailbox",
    "settings_from",
    "smtp_failure",
]
