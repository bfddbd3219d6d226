"""What the agent reads back: status, headers and body (text, or base64 when it is not
text), every secret of the destination masked."""

from __future__ import annotations

import base64
import re

import httpx

from broker.masking import Masker
from broker.typing import JSON
from effects.netguard import Reply

TEXTUAL = re.compile(
    r"^(text/|application/([\w.+-]*\+)?(json|xml|javascript|x-www-form-urlencoded))"
)


def output(reply: Reply, url: httpx.URL, hops: list[str], masker: Masker, cap: int) -> JSON:
    """The result of an exchange that ended at `url` after `hops` redirects: every secret
    masked in every form (before the body is cut to `cap` bytes, and again after)."""
    body = masker.bytes(reply.body)
    truncated = "size" if len(reply.body) > cap else reply.truncated
    if len(body) > cap:
        body = masker.bytes(body[:cap])
    return {
        "status": reply.status,
        "status_text": masker.text(reply.reason),
        "url": masker.text(str(url)),
        "redirects": [masker.text(h) for h in hops],
        "headers": _headers_out(reply.headers, masker),
        **_body_out(body, reply.encoding, _header(reply.headers, "content-type")),
        "bytes": len(body),
        "truncated": truncated is not None,
        "truncated_by": truncated,
    }


def _header(headers: list[tuple[str, str]], name: str) -> str:
    return next((v for k, v in headers if k.lower() == name), "")


def _headers_out(headers: list[tuple[str, str]], masker: Masker) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in headers:
        key = k.lower()
        out[key] = f"{out[key]}, {v}" if key in out else v
    return {masker.text(k): masker.text(v) for k, v in out.items()}


def _body_out(data: bytes, encoding: str | None, content_type: str) -> JSON:
    if TEXTUAL.match(content_type.lower()) or encoding:
        return {"body": data.decode(encoding or "utf-8", errors="replace"), "encoding": "text"}
    try:
        return {"body": data.decode("utf-8"), "encoding": "text"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(data).decode("ascii"), "encoding": "base64"}
