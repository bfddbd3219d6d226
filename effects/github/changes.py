"""What `github.pull_request.create` asks for: the `files` it commits (decoded and
checked), the reviewers it requests, and the blob SHA git gives each file's bytes."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from broker.errors import InvalidParams
from broker.typing import Params
from effects.github.text import CONTROL

TEAM = re.compile(r"([A-Za-z0-9][A-Za-z0-9-]*)/([A-Za-z0-9][A-Za-z0-9_.-]*)")
"""A team reviewer, `org/team`."""


@dataclass(frozen=True)
class Change:
    """One entry of `files`: new bytes for a path, or None to delete it."""

    path: str
    data: bytes | None


def changes(params: Params) -> list[Change]:
    """`files` decoded and checked; raises InvalidParams naming the entry at fault."""
    out: list[Change] = []
    seen: set[str] = set()
    for i, item in enumerate(params.get("files") or []):
        where = f"/params/files/{i}"
        path = item["path"]
        parts = PurePosixPath(path).parts
        if (
            path.startswith("/")
            or path.endswith("/")
            or "//" in path
            or any(p in (".", "..") or p.lower() == ".git" for p in parts)
            or CONTROL.search(path)
        ):
            raise InvalidParams(
                f"{where}/path", f"{path!r} must be a relative path without '.', '..' or .git"
            )
        if path in seen:
            raise InvalidParams(f"{where}/path", f"{path} is listed twice", "duplicate_path")
        seen.add(path)
        given = [k for k in ("content", "content_b64", "delete") if k in item]
        if len(given) != 1 or ("delete" in item and item["delete"] is not True):
            raise InvalidParams(where, "give exactly one of content, content_b64, delete: true")
        if "content" in item:
            out.append(Change(path, item["content"].encode("utf-8")))
        elif "content_b64" in item:
            try:
                out.append(Change(path, base64.b64decode(item["content_b64"], validate=True)))
            except (binascii.Error, ValueError) as exc:
                raise InvalidParams(f"{where}/content_b64", "is not valid base64") from exc
        else:
            out.append(Change(path, None))
    return out


def git_blob_sha(data: bytes) -> str:
    """The SHA git (and GitHub) gives a blob with these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def reviewers(params: Params) -> tuple[list[str], list[str]]:
    """(users, teams) to request reviews from; a team by its name without the org."""
    users, teams = [], []
    for name in params.get("reviewers") or []:
        team = TEAM.fullmatch(name)
        if team:
            teams.append(team.group(2))
        else:
            users.append(name)
    return users, teams
