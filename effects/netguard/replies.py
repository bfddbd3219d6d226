"""A response read no further than the caps allow (size and time)."""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class Reply:
    """A response read no further than the caps allow."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    truncated: str | None  # None, "size" or "time"
    encoding: str | None

    def text(self) -> str:
        return self.body.decode(self.encoding or "utf-8", errors="replace")


def read_capped(response: httpx.Response, max_bytes: int, deadline: float) -> Reply:
    """Read at most `max_bytes` of the body, stopping at `deadline` (time.monotonic)."""
    chunks: list[bytes] = []
    size = 0
    truncated: str | None = None
    try:
        for chunk in response.iter_bytes():
            if size + len(chunk) > max_bytes:
                chunks.append(chunk[: max_bytes - size])
                size = max_bytes
                truncated = "size"
                break
            chunks.append(chunk)
            size += len(chunk)
            if time.monotonic() > deadline:
                truncated = "time"
                break
    except httpx.TimeoutException:
        truncated = "time"
    finally:
        response.close()
    encoding = response.charset_encoding
    try:
        if encoding:
            codecs.lookup(encoding)
    except LookupError:
        encoding = None
    return Reply(
        status=response.status_code,
        reason=response.reason_phrase,
        headers=[(k, v) for k, v in response.headers.multi_items()],
        body=b"".join(chunks),
        truncated=truncated,
        encoding=encoding,
    )
