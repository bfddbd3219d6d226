"""What of a response returns to the sandbox: the allow-list a destination or a webhook
target declares (`response = ...`), the guarantee masking cannot give.

    response = "status"                       # the status and a few safe headers
    response = { json = ["/id", "/html_url"] } # those JSON pointers of the body, too
    response = "body"                          # everything (headers, body), masked

A service that is sent a secret can echo it in any encoding a masker does not know
(base32, gzip, rot13, split over two headers): for such a destination `status` is the
default, and only what the host allowed comes back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from broker.errors import ConfigError

Mode = Literal["status", "json", "body"]

# the headers "status" keeps, each only when its value has this strict shape
SAFE_HEADERS = {
    "content-type": re.compile(r"[a-z0-9][a-z0-9.+-]{0,40}/[a-z0-9][a-z0-9.+-]{0,60}"),
    "content-length": re.compile(r"[0-9]{1,15}"),
    "retry-after": re.compile(r"[0-9]{1,9}"),
}
POINTER = re.compile(r"(/([^~/]|~[01])*)+")


@dataclass(frozen=True)
class Allowed:
    """`response = ...`, checked."""

    mode: Mode = "body"
    pointers: tuple[str, ...] = ()

    def describe(self) -> str:
        """What a reviewer and the agent read: exactly what comes back."""
        if self.mode == "status":
            return "status only: the status code and content-type/length, no body"
        if self.mode == "json":
            return f"status and these JSON values of the body only: {', '.join(self.pointers)}"
        return "status, headers and body (secrets the host adds are masked)"

    def headers(self, headers: list[tuple[str, str]]) -> dict[str, str]:
        """The safe headers, each only in its strict shape (a media type without
        parameters, digits)."""
        out: dict[str, str] = {}
        for name, value in headers:
            key, text = name.lower(), value.split(";", 1)[0].strip().lower()
            shape = SAFE_HEADERS.get(key)
            if shape is not None and key not in out and shape.fullmatch(text):
                out[key] = text
        return out

    def pick(self, body: bytes) -> dict[str, Any]:
        """The allowed JSON values of `body`: {"json": {pointer: value}, "missing": [...]}."""
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return {"json": {}, "missing": list(self.pointers), "json_error": "not JSON"}
        found: dict[str, Any] = {}
        missing: list[str] = []
        for pointer in self.pointers:
            ok, value = resolve(doc, pointer)
            if ok:
                found[pointer] = value
            else:
                missing.append(pointer)
        return {"json": found, "missing": missing}


def resolve(doc: Any, pointer: str) -> tuple[bool, Any]:
    """RFC 6901: the value at `pointer`, and whether it is there."""
    value = doc
    for raw in pointer.split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False, None
    return True, value


def parse_allowed(value: Any, where: str, secret_sent: bool) -> Allowed:
    """`response = ...`; absent: "status" when the host sends the service a secret,
    else "body"."""
    if value is None:
        return Allowed("status" if secret_sent else "body")
    if value in ("status", "body"):
        return Allowed(value)
    if isinstance(value, dict) and set(value) == {"json"}:
        pointers = value["json"]
        if (
            isinstance(pointers, list)
            and pointers
            and all(isinstance(p, str) and POINTER.fullmatch(p) for p in pointers)
        ):
            return Allowed("json", tuple(pointers))
        raise ConfigError(f'{where}.json: a non-empty list of JSON pointers like "/id"')
    raise ConfigError(
        f'{where}: "status", "body", or {{ json = ["/id", ...] }} (JSON pointers), not {value!r}'
    )
