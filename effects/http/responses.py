"""What the agent reads back: what the destination's `response` allows (status and safe
headers, chosen JSON values, or headers and body as text or base64), every secret of
the destination masked in it too."""

from __future__ import annotations

import base64
import re

import httpx

from broker.masking import Masker
from broker.typing import JSON
from effects.netguard import Allowed, Reply

TEXTUAL = re.compile(
    r"^(text/|application/([\w.+-]*\+)?(json|xml|javascript|x-www-form-urlencoded))"
)


def output(
    reply: Reply,
    url: httpx.URL,
    hops: list[str],
    masker: Masker,
    cap: int,
    allowed: Allowed | None = None,
) -> JSON:
    """The result of an exchange that ended at `url` after `hops` redirects: what
    `allowed` lets through, every secret masked in every form (before the body is cut
    to `cap` bytes, and again after)."""
    allowed = allowed or Allowed()
    if allowed.mode != "body":
        return _allowed_only(reply, hops, masker, cap, allowed)
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
        "returned": "body",
    }


def _allowed_only(
    reply: Reply, hops: list[str], masker: Masker, cap: int, allowed: Allowed
) -> JSON:
    """Only what the host allowed: no reason phrase, no URL a redirect chose, no body
    (or only the chosen JSON values of it, masked)."""
    out: JSON = {
        "status": reply.status,
        "headers": allowed.headers(reply.headers),
        "redirects_followed": len(hops),
        "bytes": len(reply.body),
        "truncated": reply.truncated is not None,
        "returned": allowed.mode,
    }
    if allowed.mode == "json":
        picked = allowed.pick(reply.body)
        out.update(masker(picked))
    return out


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
