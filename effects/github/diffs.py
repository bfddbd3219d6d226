"""The diff an approver reads for a pull request: GitHub's comparison of a pushed branch
as `git diff` prints it, or each `files` entry diffed against its blob on the base."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from effects.github.api import Api
from effects.github.changes import Change, git_blob_sha
from effects.github.live import Live

SHOW_MAX = 256 * 1024  # larger blobs are described, not diffed
COMPARE_MAX_FILES = 300  # the compare API lists at most this many files


def compare_diff(api: Api, live: Live) -> tuple[str, list[tuple[str, str]]]:
    """A pushed branch: its commits and GitHub's patches, with facts about them."""
    assert live.head_sha is not None
    data = api.compare(live.base_sha, live.head_sha)
    commits = data.get("commits") or []
    files = data.get("files") or []
    log = []
    for c in commits:
        who = ((c.get("commit") or {}).get("author")) or {}
        message = str((c.get("commit") or {}).get("message", "")).splitlines() or [""]
        log.append(
            f"{str(c.get('sha', ''))[:12]} {who.get('name', '?')} <{who.get('email', '?')}>"
            f"\n    {message[0]}"
        )
    patches = [file_patch(f) for f in files if isinstance(f, Mapping)]
    facts = [
        (
            "commits",
            f"{data.get('ahead_by', len(commits))} ahead, "
            f"{data.get('behind_by', 0)} behind {live.base_sha[:12]}",
        ),
        ("files", str(len(files))),
    ]
    if data.get("status") in ("identical", "behind"):
        facts.append(("NO CHANGES", "head has no commits base lacks: GitHub will refuse"))
    if len(files) >= COMPARE_MAX_FILES:
        facts.append(("truncated", f"GitHub lists at most {COMPARE_MAX_FILES} files"))
    return "\n".join(log) + "\n\n" + "".join(patches), facts


def files_diff(
    api: Api, live: Live, changed: Sequence[Change]
) -> tuple[str, list[tuple[str, str]]]:
    """`files`: each one diffed against its blob on the base, with facts about them."""
    entries = live.entries or {}
    parts = []
    unchanged = []
    for c in changed:
        entry = entries.get(c.path)
        if entry is not None and c.data is not None and git_blob_sha(c.data) == entry.sha:
            unchanged.append(c.path)
            continue
        old: bytes | None = None
        if entry is not None and entry.type == "blob" and entry.mode != "120000":
            if entry.size is not None and entry.size > SHOW_MAX:
                parts.append(f"diff --git a/{c.path} b/{c.path}\n({entry.size} bytes now)\n")
                continue
            old = api.blob(entry.sha)
        parts.append(local_patch(c.path, old, c.data, entry.mode if entry else "100644"))
    facts = [("files", f"{len(changed)} ({len(unchanged)} unchanged)")]
    if unchanged and len(unchanged) == len(changed):
        facts.append(("NO CHANGES", "every file already has this content on the base"))
    return "".join(parts), facts


def file_patch(f: Mapping[str, Any]) -> str:
    """One file of a comparison as `git diff` prints it."""
    name = str(f.get("filename", "?"))
    old = str(f.get("previous_filename") or name)
    status = f.get("status")
    head = f"diff --git a/{old} b/{name}\n"
    if status == "added":
        head += f"new file\n--- /dev/null\n+++ b/{name}\n"
    elif status == "removed":
        head += f"deleted file\n--- a/{old}\n+++ /dev/null\n"
    else:
        head += (f"rename from {old}\nrename to {name}\n" if old != name else "") + (
            f"--- a/{old}\n+++ b/{name}\n"
        )
    patch = f.get("patch")
    if patch is None:
        changes_count = f.get("changes", "?")
        return head + f"(binary, or too large for GitHub to show: {changes_count} changes)\n"
    return head + str(patch).rstrip("\n") + "\n"


def local_patch(path: str, old: bytes | None, new: bytes | None, mode: str) -> str:
    """The diff of one `files` entry against the base, as GitHub will show it."""
    head = f"diff --git a/{path} b/{path}\n"
    if old is None and new is None:
        return head + "(nothing to delete: the file is not on the base)\n"
    if old is None:
        head += f"new file mode {mode}\n"
    elif new is None:
        head += f"deleted file mode {mode}\n"
    try:
        old_text = (old or b"").decode("utf-8")
        new_text = (new or b"").decode("utf-8")
        if "\0" in old_text or "\0" in new_text:
            raise UnicodeDecodeError("utf-8", b"", 0, 1, "NUL byte")
    except UnicodeDecodeError:
        sizes = f"{len(old) if old is not None else 0} → {len(new) if new is not None else 0}"
        return head + f"Binary files differ ({sizes} bytes)\n"
    lines = difflib.unified_diff(
        _lines(old_text),
        _lines(new_text),
        fromfile="/dev/null" if old is None else f"a/{path}",
        tofile="/dev/null" if new is None else f"b/{path}",
    )
    body = "".join(lines)
    if not body and old != new:
        body = "(only the newline at the end of the file changes)\n"
    return head + body


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines
