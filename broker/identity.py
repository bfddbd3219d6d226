"""Who decides, in a form nobody can fake by spelling it differently.

- On the host's command line it is the OS account of the process's effective uid, read
  from the password database: never `$USER` or `$LOGNAME`, which anyone can set.
- On the web it is the name of the approver whose token signed the request in
  (`[approvers.NAME]`); in Slack, the approver whose `slack_user` clicked. A person
  signed in with the identity provider ([web.oidc]) is the approver whose `oidc_sub` is
  theirs, else `oidc:` and a digest of the issuer and subject (`oidc_person`): never
  the display name, which anyone's profile may share or change. Their `Proof` (issuer,
  subject, name, groups, when and how they signed in) rides on the decision.
- Every name is normalised before a quorum counts it: Unicode NFKC, surrounding
  whitespace trimmed and inner runs of it made one space, case-folded; then it must be
  1 to 64 of `a-z 0-9 _ . @ : + ( ) -` and single spaces, starting with a letter or
  digit. `alice`, `Alice`, `"alice "` and `ａｌｉｃｅ` are one person.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from broker.errors import DecisionError

__all__ = ["APPROVER_NAME", "Proof", "approver_name", "oidc_person", "os_user", "same_person"]

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


def oidc_person(issuer: str, subject: str) -> str:
    """The approver a provider's subject is when no [approvers] table claims it: stable
    across renames, distinct for two accounts with one display name."""
    digest = hashlib.sha256(f"{issuer}\n{subject}".encode()).hexdigest()
    return f"oidc:{digest[:20]}"


@dataclass(frozen=True)
class Proof:
    """How a person proved who they are for this decision: an ID token's claims.

    Times are epoch seconds. Nothing of it is used past `expires` (the token's `exp`):
    the session carrying it ends there, so groups are never older than the token."""

    issuer: str
    subject: str
    name: str  # shown beside the identity, never compared
    expires: float
    auth_time: float | None = None  # when the person last authenticated at the provider
    groups: frozenset[str] = field(default_factory=frozenset)
    acr: str | None = None
    amr: tuple[str, ...] = ()

    def audit(self) -> dict[str, Any]:
        """The decision's identity as the audit log keeps it."""
        return {
            "issuer": self.issuer,
            "sub": self.subject,
            "name": self.name,
            "auth_time": self.auth_time,
            "acr": self.acr,
            "amr": list(self.amr),
            "groups": sorted(self.groups),
        }
