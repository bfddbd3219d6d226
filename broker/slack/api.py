"""The few Slack Web API calls the broker makes, with the bot token from the host.

Slack answers HTTP 200 with `{"ok": false, "error": …}` when it refuses; that, a
non-2xx status and a network failure are all NotifyError, translated here at the edge.
A `response_url` is only ever posted to when it is under the configured `hooks_url`.
"""

from __future__ import annotations

from typing import Any

import httpx

from broker.errors import NotifyError
from broker.slack.settings import SlackSettings


class Busy(NotifyError):
    """Slack is rate limiting, failing (5xx) or unreachable: worth trying again later."""


class SlackApi:
    """chat.postMessage, chat.update, views.open, and replies through a response_url."""

    def __init__(
        self,
        settings: SlackSettings,
        *,
        timeout: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self._client = httpx.Client(timeout=timeout, transport=transport, follow_redirects=False)

    def close(self) -> None:
        self._client.close()

    def call(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST one Web API method; its answer when `ok`, else NotifyError."""
        url = f"{self.settings.api_url}/{method}"
        headers = {"Authorization": f"Bearer {self.settings.bot_token}"}
        try:
            response = self._client.post(url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise Busy(f"Slack {method}: {type(exc).__name__}") from exc
        if response.status_code == 429 or response.status_code >= 500:
            raise Busy(f"Slack {method}: HTTP {response.status_code}")
        if not 200 <= response.status_code < 300:
            raise NotifyError(f"Slack {method}: HTTP {response.status_code}")
        try:
            answer = response.json()
        except ValueError as exc:
            raise NotifyError(f"Slack {method}: not a JSON answer") from exc
        if not isinstance(answer, dict) or answer.get("ok") is not True:
            error = answer.get("error") if isinstance(answer, dict) else None
            raise NotifyError(f"Slack {method}: {error or 'not ok'}")
        return answer

    def respond(self, response_url: str, body: dict[str, Any]) -> None:
        """Reply through a click's response_url (ephemeral messages back to the clicker)."""
        if not isinstance(response_url, str) or not response_url.startswith(
            self.settings.hooks_url
        ):
            raise NotifyError("Slack response_url: not under notify.slack.hooks_url; not used")
        try:
            response = self._client.post(response_url, json=body)
        except httpx.HTTPError as exc:
            raise NotifyError(f"Slack response_url: {type(exc).__name__}") from exc
        if not 200 <= response.status_code < 300:
            raise NotifyError(f"Slack response_url: HTTP {response.status_code}")
