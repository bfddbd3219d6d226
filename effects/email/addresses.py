"""Mailboxes as the broker accepts them: 'jane@example.com' or
'Jane Doe <jane@example.com>', nothing looser."""

from __future__ import annotations

import re
from email.headerregistry import Address

from broker.errors import InvalidParams
from effects.email.headers import check_header_text

_LOCAL = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_ADDR_SPEC = re.compile(rf"(?P<local>{_LOCAL})@(?P<domain>{_LABEL}(?:\.{_LABEL})+)")
_NAME_ADDR = re.compile(r"(?P<name>[^<>\x00-\x1f]*?)\s*<(?P<spec>[^<>]*)>")


def parse_mailbox(text: str, where: str) -> Address:
    """'jane@example.com' or 'Jane Doe <jane@example.com>'; nothing looser."""
    text = text.strip()
    named = _NAME_ADDR.fullmatch(text)
    name, spec = (
        (named.group("name").strip().strip('"'), named.group("spec")) if named else ("", text)
    )
    match = _ADDR_SPEC.fullmatch(spec)
    if match is None:
        raise InvalidParams(
            where,
            f"{text!r} is not an address like jane@example.com or 'Jane Doe <jane@example.com>'",
            "bad_address",
        )
    check_header_text(name, where, "the display name")
    local, domain = match.group("local"), match.group("domain")
    try:
        return Address(display_name=name, username=local, domain=domain.lower())
    except Exception as exc:  # the email package raises several types for one problem
        raise InvalidParams(
            where, f"{text!r} is not a valid address: {exc}", "bad_address"
        ) from exc
