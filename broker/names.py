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
    WITHDRAWAL = "withdrawal"  # protocol version 2: `<request id>.withdraw`
    TEMPORARY = "temporary"
    BAD = "bad"


def classify(name: str) -> tuple[Kind, str, str]:
    """What a directory entry is by its name: (kind, request name, attachment name); for
    a withdrawal, the id of the request it withdraws in place of the request name."""
    if name.startswith(".") or name.endswith(".tmp"):
        return Kind.TEMPORARY, "", ""
    if name.endswith(".withdraw"):
        stem = name[: -len(".withdraw")]
        return (Kind.WITHDRAWAL, stem, "") if REQUEST_ID.fullmatch(stem) else (Kind.BAD, "", "")
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
