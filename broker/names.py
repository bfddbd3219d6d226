"""The names a sandbox may give its files and requests (PROTOCOL.md), and what each is."""

from __future__ import annotations

import enum
import re

REQUEST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
ATTACHMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class Kind(enum.Enum):
    REQUEST = "request"
    ATTACHMENT = "attachment"
    TEMPORARY = "temporary"
    BAD = "bad"


def classify(name: str) -> tuple[Kind, str, str]:
    """What a directory entry is by its name: (kind, request name, attachment name)."""
    if name.startswith(".") or name.endswith(".tmp"):
        return Kind.TEMPORARY, "", ""
    if name.endswith(".json"):
        stem = name[: -len(".json")]
        if REQUEST_NAME.fullmatch(stem):
            return Kind.REQUEST, stem, ""
    elif name.endswith(".bin"):
        parts = name[: -len(".bin")].split(".")
        if (
            len(parts) == 2
            and REQUEST_NAME.fullmatch(parts[0])
            and ATTACHMENT_NAME.fullmatch(parts[1])
        ):
            return Kind.ATTACHMENT, parts[0], parts[1]
    return Kind.BAD, "", ""
