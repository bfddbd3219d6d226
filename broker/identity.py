"""Who decides, in a form nobody can fake by spelling it differently.

- On the host's command line it is the OS account of the process's effective uid, read
  from the password database: never `$USER` or `$LOGNAME`, which anyone can set.
- On the web it is the name of the approver whose token signed the request in
  (`[approvers.NAME]`); in Slack, the approver whose `slack_user` clicked.
- Every name is normalised before a quorum counts it: Unicode NFKC, surrounding
  whitespace trimmed and inner runs of it made one space, case-folded; then it must be
  1 to 64 of `a-z 0-9 _ . @ : + ( ) -` and single spaces, starting with a letter or
  digit. `alice`, `Alice`, `"alice "` and `ａｌｉｃｅ` are one person.
"""

from __future__ import annotations

import os
import pwd
import re
import unicodedata

from broker.errors import DecisionError

__all__ = ["APPROVER_NAME", "approver_name", "os_user", "same_person"]

APPROVER_NAME = re.compile(r"[a-z0-9](?:[a-z0-9_.@:+()-]| (?! )){0,63}")
"""A normalised approver name."""


def approver_name(name: str) -> str:
    """`name` normalised (NFKC, trimmed, case-folded); DecisionError if it is then not
    1-64 of a-z, 0-9, `_ . @ -` starting with a letter or digit."""
    folded = _loose(name)
    if not APPROVER_NAME.fullmatch(folded) or folded.endswith(" "):
        raise DecisionError(
            f"{name!r} is not a usable approver name: after trimming and lower-casing it "
            "must be 1-64 of a-z, 0-9, '_.@:+()-' and single spaces, starting with a "
            "letter or digit"
        )
    return folded


def _loose(name: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", name).split()).casefold()


def same_person(a: str, b: str) -> bool:
    """Whether two recorded names are one person (old rows may predate normalisation)."""

    return _loose(a) == _loose(b)


def os_user() -> str:
    """The account of the effective uid, from the password database, normalised."""
    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        raise DecisionError(
            f"the effective uid {uid} has no account in the password database, so the "
            "broker cannot say who decides; run as a named user"
        ) from None
    return approver_name(name)
