"""Building blocks for a handler's `canonical(params, ctx)`: one form per value, or a
refusal naming what to write instead (see `broker.intake.canonical` for where it runs)."""

from __future__ import annotations

import unicodedata
from pathlib import PurePosixPath

from broker.errors import InvalidParams

__all__ = ["branch_name", "nfc", "relative_path", "url_path"]


def nfc(text: str, pointer: str, what: str = "the value") -> str:
    """`text` if it is in Unicode NFC; else InvalidParams (two spellings, one look)."""
    if not unicodedata.is_normalized("NFC", text):
        raise InvalidParams(
            pointer,
            f"{what} is not in Unicode NFC (composed) form; write it composed, as "
            f"{unicodedata.normalize('NFC', text)!r}",
            "not_canonical",
        )
    return text


def relative_path(path: str, pointer: str, *, what: str = "the path") -> str:
    """A relative POSIX path in its one form: no `./`, no `//`, no trailing `/` or `/.`;
    InvalidParams for an absolute path, `..`, control characters, non-NFC or nothing."""
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise InvalidParams(pointer, f"{what} holds control characters", "bad_path")
    nfc(path, pointer, what)
    if path.startswith("/"):
        raise InvalidParams(pointer, f"{what} must be relative, not start with '/'", "bad_path")
    parts = [p for p in PurePosixPath(path).parts if p != "."]
    if ".." in parts:
        raise InvalidParams(pointer, f"{what} must not hold '..'", "bad_path")
    if not parts:
        raise InvalidParams(pointer, f"{what} names no file", "bad_path")
    return "/".join(parts)


def url_path(path: str) -> str:
    """A URL path with empty and `.` segments dropped (`//a/./b` → `/a/b`); `..` is the
    caller's to refuse. A trailing `/` is kept: for a server it is another resource."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    tail = "/" if path.endswith(("/", "/.")) and parts else ""
    return "/" + "/".join(parts) + tail


def branch_name(name: str, pointer: str) -> str:
    """A branch as git names it below refs/heads/, in its one spelling; else InvalidParams."""
    parts = name.split("/")
    if (
        name.startswith("refs/")
        or name == "HEAD"
        or any(not p or p.startswith(".") or p.endswith(".lock") for p in parts)
        or name.endswith(".")
        or ".." in name
        or "@{" in name
    ):
        raise InvalidParams(
            pointer,
            f"{name!r} is not a branch name in its plain form (no refs/ prefix, no empty, "
            "'.'-led or .lock parts, no '..', '@{' or trailing '.')",
            "bad_branch",
        )
    return name
