"""Slack's request signatures: is this POST from Slack, and from the last five minutes?

Slack signs each request with the app's signing secret:
`X-Slack-Signature: v0=<hex HMAC-SHA256(secret, "v0:{X-Slack-Request-Timestamp}:{body}")>`.
A request whose timestamp is more than five minutes from now is refused (a replay, or a
clock to fix); one seen before within that window is refused by the store (SlackStore).
"""

from __future__ import annotations

import hashlib
import hmac
import re

WINDOW_S = 300
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


class Unsigned(Exception):
    """A request that is not Slack's own, or not fresh: `code` says which."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The X-Slack-Signature Slack would send for `body` at `timestamp`."""
    base = b"v0:" + timestamp.encode("ascii") + b":" + body
    return "v0=" + hmac.new(secret.encode("utf-8"), base, hashlib.sha256).hexdigest()


def verify(
    secret: str, timestamp: str | None, supplied: str | None, body: bytes, now: float
) -> None:
    """Raise Unsigned unless `supplied` is Slack's signature of `body` within the window."""
    if not timestamp or not _TIMESTAMP.fullmatch(timestamp):
        raise Unsigned("unsigned", "no X-Slack-Request-Timestamp: not a request from Slack")
    if abs(now - int(timestamp)) > WINDOW_S:
        raise Unsigned(
            "stale",
            "X-Slack-Request-Timestamp is more than five minutes from now: refused as a "
            "possible replay (or this host's clock is wrong)",
        )
    expected = signature(secret, timestamp, body)
    if not supplied or not hmac.compare_digest(expected.encode(), supplied.encode()):
        raise Unsigned("bad_signature", "X-Slack-Signature does not match: not from Slack")
