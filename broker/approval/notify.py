"""Telling people that a request waits: webhooks (generic JSON or Slack-compatible
text), and Slack's interactive messages (broker.slack) with Approve/Deny buttons.

Configured in broker.toml:

    [notify]
    inbox_url = "http://127.0.0.1:8700"      # optional: links to the inbox page
    [[notify.webhooks]]
    url_env = "SLACK_WEBHOOK_URL"           # or url_file, or url for a local hook
    format = "slack"                        # or "json"
    [notify.slack]                          # see broker/slack/settings.py
    bot_token_env = "SLACK_BOT_TOKEN"
    signing_secret_env = "SLACK_SIGNING_SECRET"
    channel = "C0123456789"
    [notify.groups.platform]                # a rule's `notify = "platform"` goes here
    slack_channel = "C0PLATFORM"            # instead of [notify.slack]'s channel
    webhooks = [{ url_env = "PLATFORM_HOOK", format = "slack" }]   # instead of the above

A request whose rule names a configured group is told to that group alone (its Slack
channel, its webhooks); any other, and one naming a group not configured, to the rest.

Delivery runs on its own thread, retried with backoff; a failure is logged and
counted, and never blocks or loses the request (people can always run `broker pending`).
`attach(broker, config)` wires what [notify] asks for onto a serving broker.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from broker.clock import REAL, Clock
from broker.config import Config
from broker.errors import ConfigError
from broker.masking import quiet_http_libraries
from broker.settings import only_keys, resolve_secret
from broker.untrusted import neutralize

if TYPE_CHECKING:
    import httpx

    from broker.models import Record
    from broker.registry import Registry
    from broker.slack.notifier import SlackNotifier
    from broker.store.base import Store

log = logging.getLogger("broker.approval.notify")
FORMATS = ("json", "slack")


@dataclass(frozen=True)
class Webhook:
    url: str
    format: str = "json"


@dataclass(frozen=True)
class Route:
    """Where a group is told: its webhooks, and its Slack channel."""

    hooks: tuple[Webhook, ...] = ()
    slack_channel: str | None = None


def webhooks_from(settings: Mapping[str, Any], base_dir: Path | None = None) -> list[Webhook]:
    """Read [[notify.webhooks]]; a fault names the entry and key. A relative `url_file`
    is read beside broker.toml (`base_dir`), as every secret."""
    only_keys("notify", settings, {"webhooks", "inbox_url", "retries", "slack", "groups"})
    return _hooks(settings.get("webhooks", []), "notify.webhooks", base_dir)


def groups_from(settings: Mapping[str, Any], base_dir: Path | None = None) -> dict[str, Route]:
    """Read [notify.groups.NAME]: each group's webhooks and Slack channel."""
    routes = {}
    groups = settings.get("groups", {})
    if not isinstance(groups, Mapping):
        raise ConfigError("notify.groups: must be a table of [notify.groups.NAME] tables")
    for name, entry in groups.items():
        where = f"notify.groups.{name}"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"[{where}] must be a table")
        only_keys(where, entry, {"webhooks", "slack_channel"})
        channel = entry.get("slack_channel")
        if channel is not None and not (isinstance(channel, str) and channel.strip()):
            raise ConfigError(f'{where}.slack_channel: a channel id, e.g. "C0123456789"')
        hooks = _hooks(entry.get("webhooks", []), f"{where}.webhooks", base_dir)
        routes[name] = Route(tuple(hooks), channel)
    return routes


def _hooks(entries: Any, at: str, base_dir: Path | None) -> list[Webhook]:
    if not isinstance(entries, list):
        raise ConfigError(f"{at}: must be an array of tables")
    hooks = []
    for i, entry in enumerate(entries):
        where = f"{at}[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: must be a table")
        only_keys(where, entry, {"url", "url_env", "url_file", "format"})
        url = entry.get("url") or resolve_secret(entry, "url", where, base_dir)
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}.url: an http(s) URL is required")
        fmt = entry.get("format", "json")
        if fmt not in FORMATS:
            raise ConfigError(f"{where}.format: must be json or slack, not {fmt!r}")
        hooks.append(Webhook(url, fmt))
    return hooks


def payload(card: Mapping[str, Any], hook: Webhook, inbox_url: str | None) -> dict[str, Any]:
    """The message for one waiting request, neutralised for the reader's screen."""
    ref = str(card["ref"])
    link = f"{inbox_url.rstrip('/')}/requests/{ref}" if inbox_url else None
    what = neutralize(str(card["what"]["title"]))
    why = neutralize(f"{card['why']['rule']}: {card['why']['reason']}")
    left = card["if_nobody_answers"]
    then = "denied" if left["on_timeout"] == "deny" else "applied"
    commands = {"approve": f"broker approve {ref}", "deny": f"broker deny {ref} --reason '…'"}
    if hook.format == "json":
        return {
            "type": "approval.pending",
            "ref": ref,
            "sandbox": card["sandbox"],
            "id": card["id"],
            "effect": card["effect"],
            "what": what,
            "where": neutralize(str(card["where"])),
            "body": neutralize(str(card["what"]["body"]), keep_newlines=True),
            "why": why,
            "expires_at": left["expires_at"],
            "on_timeout": left["on_timeout"],
            "agent_reason": neutralize(str(card["agent_reason"] or "")),
            "request_sha256": card["request_sha256"],
            "decide": {**commands, "url": link},
        }

    def esc(text: str) -> str:
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    body = neutralize(str(card["what"]["body"]), keep_newlines=True)
    if len(body) > 2500:
        body = body[:2500] + "\n… (truncated: see the full content before deciding)"
    lines = [
        f"*Approval needed* `{esc(ref)}` ({esc(str(card['effect']))})",
        f"*What:* {esc(what)}",
        f"*Where:* {esc(neutralize(str(card['where'])))}",
        f"*Why it stopped:* {esc(why)}",
        f"*If nobody answers* by {left['expires_at']}: {then}",
    ]
    if card["agent_reason"]:
        lines.append(f"*The agent says (unverified):* {esc(neutralize(str(card['agent_reason'])))}")
    if body:
        lines.append("```" + esc(body.replace("```", "ʼʼʼ")) + "```")
    lines.append(
        f"Decide: `{commands['approve']}` or `{commands['deny']}`" + (f" or {link}" if link else "")
    )
    return {"text": "\n".join(lines)}


class Notifier:
    """A queue and a thread that deliver notifications; never raises into the caller."""

    def __init__(
        self,
        hooks: list[Webhook],
        *,
        inbox_url: str | None = None,
        retries: int = 5,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
        slack: SlackNotifier | None = None,
        clock: Clock = REAL,
        groups: Mapping[str, Route] | None = None,
    ) -> None:
        self.hooks = hooks
        self.groups = dict(groups or {})
        self.clock = clock  # paces the retries
        self.slack = slack
        self.inbox_url = inbox_url
        self.retries = retries
        self.backoff = backoff
        self.delivered = 0
        self.failed = 0
        self._queue: queue.Queue[tuple[Webhook, dict[str, Any]] | None] = queue.Queue()
        import httpx  # here: a run whose [notify] asks for nothing never imports it

        quiet_http_libraries()  # httpx logs each URL at INFO, and a webhook's URL is a secret
        self._client = httpx.Client(timeout=10.0, transport=transport, follow_redirects=False)
        self._seen: set[tuple[str, str]] = set()
        self._thread = threading.Thread(target=self._run, name="broker-notify", daemon=True)
        self._thread.start()

    def observe(self, ledger: Store, record: Record, registry: Registry) -> None:
        """An observer of results: tell of a request that starts waiting, and update
        Slack's message once it reaches its outcome."""
        from broker.approval.decisions import card

        if record.state == "pending":
            self.pending(card(ledger, record, registry), (record.verdict or {}).get("notify"))
        elif record.terminal and self.slack is not None:
            self.settled(card(ledger, record, registry), record.output)

    def pending(self, card: Mapping[str, Any], group: str | None = None) -> None:
        """Queue one message per webhook for a request that started waiting: the
        webhooks and channel of the group its rule names, if configured, else the rest."""
        key = (str(card["ref"]), str(card["request_sha256"]))
        if key in self._seen:
            return
        self._seen.add(key)
        route = self.groups.get(group) if group else None
        for hook in route.hooks if route is not None else self.hooks:
            self._queue.put((hook, payload(card, hook, self.inbox_url)))
        if self.slack is not None and (route is None or route.slack_channel):
            shown = _shown(card, None)
            if route is not None:
                shown["slack_channel"] = route.slack_channel
            self.slack.pending(shown)

    def settled(self, card: Mapping[str, Any], output: Any = None) -> None:
        """A request with a message in Slack reached its outcome: update the message."""
        if self.slack is not None:
            self.slack.settled(_shown(card, output))

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)
        self._client.close()
        if self.slack is not None:
            self.slack.close(timeout)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            hook, body = item
            try:
                self._deliver(hook, body)
            except Exception:  # an observer never breaks anything
                self.failed += 1
                log.exception("notification to a webhook failed")

    def _deliver(self, hook: Webhook, body: dict[str, Any]) -> None:
        delay = self.backoff
        import httpx

        for attempt in range(1, self.retries + 1):
            try:
                response = self._client.post(hook.url, json=body)
                if response.status_code < 300:
                    self.delivered += 1
                    return
                retry = response.status_code >= 500 or response.status_code == 429
                problem = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                retry, problem = True, type(exc).__name__
            if not retry or attempt == self.retries:
                self.failed += 1
                log.warning("notification not delivered (%s) after %d attempt(s)", problem, attempt)
                return
            self.clock.sleep(delay)
            delay = min(delay * 2, 30.0)


def _shown(card: Mapping[str, Any], output: Any) -> dict[str, Any]:
    """The card with the inbox's summary, markers and warning (broker.approval.card)."""
    from broker.approval.card import extend

    return extend(dict(card), output)


def notifier_from(config: Config) -> Notifier | None:
    """What [notify] asks for (webhooks, Slack), checked; None when it asks for nothing."""
    from broker.slack.settings import slack_settings

    hooks = webhooks_from(config.notify, config.base_dir)
    groups = groups_from(config.notify, config.base_dir)
    slack = slack_settings(config)
    if not hooks and not groups and slack is None:
        return None
    inbox_url = config.notify.get("inbox_url")
    if slack is None:
        return Notifier(hooks, inbox_url=inbox_url, groups=groups)
    from broker.slack.notifier import SlackNotifier

    return Notifier(hooks, inbox_url=inbox_url, slack=SlackNotifier(slack), groups=groups)


class Notifiable(Protocol):
    """What can tell people: the serving broker (broker.loop.pipeline.Broker)."""

    def notify_with(self, notifier: Notifier) -> None: ...


def attach(broker: Notifiable, config: Config, notifier: Notifier | None = None) -> Notifier | None:
    """Tell people through `notifier` (else what [notify] configures) when a request starts
    waiting, and update Slack's message when it reaches its outcome."""
    notifier = notifier or notifier_from(config)
    if notifier is not None:
        broker.notify_with(notifier)
    return notifier
