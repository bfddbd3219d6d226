"""What an outcome says beyond its state, the same on every surface: whether an applied
effect's service answered an error status (the effect ran, but did not do what was
asked), and the links in what came back.

    >>> service_status("applied", {"status": 501, "status_text": "Not Implemented"})
    501
    >>> service_warning("applied", {"status": 501, "status_text": "Not Implemented"})
    'applied, but the service answered HTTP 501 Not Implemented'
    >>> links({"url": "https://github.com/acme/api/pull/42", "number": 42})
    [('url', 'https://github.com/acme/api/pull/42')]

Pure functions over a state and an output; nothing here reads the ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

MAX_LINKS = 8


def service_status(state: str, output: Any) -> int | None:
    """The HTTP status of 400 or more an applied effect's output reports, else None."""
    if state != "applied" or not isinstance(output, Mapping):
        return None
    status = output.get("status", output.get("status_code"))
    if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
        return None
    return status


def service_warning(state: str, output: Any) -> str | None:
    """A sentence when an applied effect's output shows that the service refused or broke."""
    status = service_status(state, output)
    if status is None or not isinstance(output, Mapping):
        return None
    text = output.get("status_text")
    said = f" {text}" if isinstance(text, str) and text else ""
    return f"applied, but the service answered HTTP {status}{said}"


def links(output: Any) -> list[tuple[str, str]]:
    """(key, URL) for each http(s) URL among an output's top-level strings: the PR, the
    issue, the object a person opens next. Other schemes are never made links."""
    if not isinstance(output, Mapping):
        return []
    found: list[tuple[str, str]] = []
    for key, value in output.items():
        if isinstance(value, str) and _is_web_url(value):
            found.append((str(key), value))
    return found[:MAX_LINKS]


def _is_web_url(text: str) -> bool:
    if len(text) > 2000 or any(c.isspace() or ord(c) < 32 for c in text):
        return False
    try:
        parts = urlsplit(text)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc)
