"""`EmailSend`: check the envelope, preview the message as sent, deliver it."""

from __future__ import annotations

import smtplib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

from broker.errors import ConfigError, EffectFailed
from broker.models import Preview
from broker.typing import JSON, Params
from effects import kv
from effects.base import Context, Handler
from effects.email.delivery import reply_text, send
from effects.email.errors import smtp_failure
from effects.email.message import build_message, envelope
from effects.email.settings import EmailSettings, settings_from


class EmailSend(Handler):
    """Send one message through the host's SMTP server."""

    name = "email.send"
    identifying = ("to", "cc", "bcc", "reply_to")
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
            "password_kv",
            "credential",
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
    def _settings(ctx: Context, fetch: bool = False) -> EmailSettings:
        """The checked settings; a KV password is read only when `fetch` (at apply)."""
        if not ctx.settings:
            raise EffectFailed(
                "failed: email.send is not configured on this host ([integrations.email])"
            )
        try:
            return settings_from(ctx.settings, kv.reader(ctx, "integrations.email", fetch))
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
        settings = self._settings(ctx, fetch=True)
        env = envelope(params, settings)
        msg = build_message(params, settings, env, ctx, datetime.now(UTC))
        try:
            refused = send(msg, settings, env.recipients)
        except (smtplib.SMTPException, OSError) as exc:
            raise smtp_failure(exc, settings) from exc
        return {
            "message_id": str(msg["Message-ID"]),
            "from": settings.sender.addr_spec,
            "accepted": [r for r in env.recipients if r not in refused],
            "refused": {r: f"{code} {reply_text(reply)}" for r, (code, reply) in refused.items()},
        }
