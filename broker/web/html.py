"""Untrusted text as HTML: escaped, with every hiding character shown as a marked tag.

The same neutralisation as the CLI (broker.untrusted): `shown(t)` reads, as text, exactly
like `render.html_text(t)`; each character that was made visible is wrapped in
`<span class="ctl">` so that a reviewer can tell it from literal text.
"""

from __future__ import annotations

import html
from urllib.parse import quote

from markupsafe import Markup

from broker.untrusted import neutralize


def shown(text: str, *, keep_newlines: bool = False) -> Markup:
    """`text` escaped for HTML, hidden and control characters visible and marked."""
    if neutralize(text, keep_newlines=keep_newlines) == text:
        return Markup(html.escape(text, quote=True))
    parts = []
    for ch in text:
        visible = neutralize(ch, keep_newlines=keep_newlines)
        if visible == ch:
            parts.append(html.escape(ch, quote=True))
        else:
            parts.append(f'<span class="ctl">{html.escape(visible, quote=True)}</span>')
    return Markup("".join(parts))


def body_lines(body: str, kind: str) -> list[tuple[str, Markup]]:
    """The body as (css class, line) pairs: a diff's lines classed by their first mark."""
    lines = []
    for line in body.split("\n"):
        cls = "ctx"
        if kind == "diff":
            if line.startswith(("+++", "---")):
                cls = "hdr"
            elif line.startswith("@@"):
                cls = "hunk"
            elif line.startswith("+"):
                cls = "add"
            elif line.startswith("-"):
                cls = "del"
        lines.append((cls, shown(line, keep_newlines=True)))
    if len(lines) > 1 and body.endswith("\n"):
        lines.pop()  # the last line's newline, not an empty line of its own
    return lines


def duration(seconds: float | None) -> str:
    """1h02m, 3m05s, 42s."""
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    if whole >= 86400:
        return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole}s"


def then(on_timeout: str | None) -> str:
    """What happens at the deadline, in words."""
    return {
        "deny": "it is denied (fails closed)",
        "approve": "it is applied",
    }.get(on_timeout or "", "nothing is decided automatically")


def request_url(sandbox: str, request_id: str) -> str:
    return f"/requests/{quote(sandbox, safe='')}/{quote(request_id, safe='')}"
