"""[notify.slack] in broker.toml, and who is who in Slack.

    [notify.slack]
    bot_token_env = "SLACK_BOT_TOKEN"          # or bot_token_file: chat:write
    signing_secret_env = "SLACK_SIGNING_SECRET" # or signing_secret_file
    channel = "C0123456789"                    # where waiting requests are posted
    remind_before = "15m"                      # a reminder this long before a deadline
                                               # (false: none)
    [approvers.alice]
    token_sha256 = "…"                         # the web inbox (optional with slack_user)
    slack_user = "U0123ABCD"                   # her Slack user id: her clicks count as hers

Secrets are references only. `api_url` and `hooks_url` (Slack's, by default) may point
at a local stand-in for tests; anything but https is refused off loopback.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from broker.clock import parse_duration
from broker.config import Config
from broker.errors import ConfigError
from broker.settings import only_keys, resolve_secret

API_URL = "https://slack.com/api"
HOOKS_URL = "https://hooks.slack.com/"
KEYS = {
    "bot_token_env",
    "bot_token_file",
    "signing_secret_env",
    "signing_secret_file",
    "channel",
    "remind_before",
    "api_url",
    "hooks_url",
}
SLACK_USER = re.compile(r"[UW][A-Z0-9]{2,20}")
CHANNEL = re.compile(r"[A-Za-z0-9#_.-]{1,80}")


@dataclass(frozen=True)
class SlackSettings:
    """What the notifier and the callback need; the secrets stay out of repr()."""

    bot_token: str = field(repr=False)
    signing_secret: str = field(repr=False)
    channel: str
    users: Mapping[str, str]  # Slack user id -> approver name
    store_path: Path
    remind_before_s: float | None = 900.0
    api_url: str = API_URL
    hooks_url: str = HOOKS_URL
    inbox_url: str | None = None


def slack_settings(config: Config) -> SlackSettings | None:
    """[notify.slack], checked; None when it is absent. A mistake names its key."""
    table = config.notify.get("slack")
    if table is None:
        return None
    where = "notify.slack"
    if not isinstance(table, Mapping):
        raise ConfigError(f"[{where}] must be a table")
    for literal in ("bot_token", "signing_secret"):
        if literal in table:
            raise ConfigError(
                f"{where}.{literal}: secrets are never written in broker.toml; "
                f"use {literal}_env (an environment variable) or {literal}_file (a file)"
            )
    only_keys(where, table, KEYS)
    secrets = {}
    for key in ("bot_token", "signing_secret"):
        value = resolve_secret(table, key, where, config.base_dir)
        if not value:
            raise ConfigError(f"{where}.{key}_env or {where}.{key}_file: required")
        secrets[key] = value
    channel = table.get("channel")
    if not isinstance(channel, str) or not CHANNEL.fullmatch(channel):
        raise ConfigError(f'{where}.channel: required, a channel id such as "C0123456789"')
    return SlackSettings(
        bot_token=secrets["bot_token"],
        signing_secret=secrets["signing_secret"],
        channel=channel,
        users=slack_users(config.approvers),
        store_path=config.state_dir / "slack.sqlite3",
        remind_before_s=_remind_before(table.get("remind_before", "15m"), where),
        api_url=_url(table.get("api_url", API_URL), f"{where}.api_url").rstrip("/"),
        hooks_url=_url(table.get("hooks_url", HOOKS_URL), f"{where}.hooks_url"),
        inbox_url=_inbox_url(config.notify.get("inbox_url")),
    )


def slack_users(approvers: Mapping[str, Any]) -> dict[str, str]:
    """{Slack user id: approver name} from [approvers.NAME] slack_user; one id, one person."""
    users: dict[str, str] = {}
    for name, entry in approvers.items():
        if not isinstance(entry, Mapping) or "slack_user" not in entry:
            continue
        user = entry["slack_user"]
        if not isinstance(user, str) or not SLACK_USER.fullmatch(user):
            raise ConfigError(
                f'approvers.{name}.slack_user: a Slack user id such as "U0123ABCD" '
                "(in Slack: the person's profile, ⋮, Copy member ID)"
            )
        if user in users:
            raise ConfigError(
                f"approvers.{name}.slack_user: {user} is already approvers.{users[user]}'s; "
                "each person needs their own"
            )
        users[user] = name
    return users


def _remind_before(value: Any, where: str) -> float | None:
    if value is False:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ConfigError(f"{where}.remind_before: {exc}; or false for no reminder") from exc


def _url(value: Any, where: str) -> str:
    """https, or http to a loopback stand-in: the bot token never crosses a network bare."""
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: an https URL is required")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise ConfigError(f"{where}: https is required (http only to a loopback address)")
    return str(value)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _inbox_url(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ConfigError("notify.inbox_url: an http(s) URL is required")
    return value.rstrip("/")
