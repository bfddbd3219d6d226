"""Text the agent wrote, as it will be posted: @-mentions made inert but visible.

GitHub links and notifies only an `@` directly followed by the name, so `@name` and
`@org/team` (and `&#64;` / `&commat;` spellings) are posted as `@ name`; URLs are left
as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_URL = re.compile(r"https?://[^\s<>()\[\]]+", re.I)
_MENTION = re.compile(
    r"(?<![A-Za-z0-9_])(?:@|&#0*64;|&#x0*40;|&commat;)"
    r"([A-Za-z0-9][A-Za-z0-9-]*(?:/[A-Za-z0-9][A-Za-z0-9_.-]*)?)",
    re.I,
)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def neutralise(text: str) -> tuple[str, list[str]]:
    """Make @-mentions inert but visible: `@name` → `@ name`; returns the names found."""
    found: list[str] = []

    def inert(match: re.Match[str]) -> str:
        found.append(match.group(1))
        return "@ " + match.group(1)

    out: list[str] = []
    pos = 0
    for url in _URL.finditer(text):
        out.append(_MENTION.sub(inert, text[pos : url.start()]))
        out.append(url.group(0))
        pos = url.end()
    out.append(_MENTION.sub(inert, text[pos:]))
    return "".join(out), found


class Text:
    """The agent's text fields as they will be posted, and the mentions neutralised."""

    def __init__(self, allow_mentions: bool) -> None:
        self.allow = allow_mentions
        self.mentions: list[str] = []

    def __call__(self, value: str | None) -> str:
        if not value or self.allow:
            return value or ""
        out, found = neutralise(value)
        self.mentions.extend(m for m in found if m not in self.mentions)
        return out


def oneline(text: str, limit: int = 200) -> str:
    """`text` on one line, without control characters, at most `limit` characters."""
    return CONTROL.sub(" ", text.replace("\n", " "))[:limit]


def mention_facts(text: Text) -> list[tuple[str, str]]:
    """The preview's fact naming the mentions neutralised, if any."""
    if not text.mentions:
        return []
    names = ", ".join(text.mentions[:20])
    return [("mentions neutralised", f"{names} (posted as '@ name': nobody is notified)")]


def thread_line(data: Mapping[str, Any]) -> str:
    """An issue or pull request in one line: number, title, state."""
    state = data.get("state", "?")
    if data.get("locked"):
        state = f"{state}, locked"
    return f"#{data.get('number')} {oneline(str(data.get('title', '')))} ({state})"
