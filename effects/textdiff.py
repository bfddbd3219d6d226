r"""A unified diff of two texts as git shows it: lines split at `\n` only, and a last
line without its newline marked `\ No newline at end of file`, so an added line is
never glued onto a removed one."""

from __future__ import annotations

import difflib

NO_NEWLINE = "\\ No newline at end of file\n"


def lines_of(text: str) -> list[str]:
    r"""`text` as diff lines, each ending in `\n` (the marker after an unended last one)."""
    if not text:
        return []
    lines = [line + "\n" for line in text.split("\n")]
    if text.endswith("\n"):
        lines.pop()
    else:
        lines[-1] += NO_NEWLINE
    return lines


def unified(old: str, new: str, fromfile: str, tofile: str) -> str:
    """The unified diff from `old` to `new` ('' when they are the same text)."""
    return "".join(difflib.unified_diff(lines_of(old), lines_of(new), fromfile, tofile))
