"""What the agent reads back: status, headers and body (text, or base64 when it is not
text), every secret of the destination masked."""

from __future__ import annotations

import base64
import re

import httpx

from broker.typing import JSON
from effects.netguard import Reply, scrub, scrub_bytes

TEXTUAL = re.compile(
    r"^(text/|application/([\w.+-]*\+)?(json|xml|javascript|x-www-form-urlencoded))"
)


def output(reply: Reply, url: httpx.URL, hops: list[str], secrets: list[str]) -> JSON:
    """The result of an exchange that ended at `url` after `hops` redirects."""
    return {
        "status": reply.status,
        "status_text": reply.reason,
        "url": str(url),
        "redirects": hops,
        "headers": _headers_out(reply.headers, secrets),
        **_body_out(reply.body, reply.encoding, _header(reply.headers, "content-type"), secrets),
        "bytes": len(reply.body),
        "truncated": reply.truncated is not None,
        "truncated_by": reply.truncated,
    }


def _header(headers: list[tuple[str, str]], name: str) -> str:
    return next((v for k, v in headers if k.lower() == name), "")


def _headers_out(headers: list[tuple[str, str]], secrets: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in headers:
        key = k.lower()
        out[key] = f"{out[key]}, {v}" if key in out else v
    return {k: scrub(v, secrets) for k, v in out.items()}


def _body_out(data: bytes, encoding: str | None, content_type: str, secrets: list[str]) -> JSON:
    data = scrub_bytes(data, secrets)
    if TEXTUAL.match(content_type.lower()) or encoding:
        return {"body": data.decode(encoding or "utf-8", errors="replace"), "encoding": "text"}
    try:
        return {"body": data.decode("utf-8"), "encoding": "text"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(data).decode("ascii"), "encoding": "base64"}
