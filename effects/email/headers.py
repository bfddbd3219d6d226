"""Header text the agent writes (the subject, display names), checked so that no line
can be folded into the message's headers: no control character, raw or inside an
RFC 2047 encoded word (`=?utf-8?q?=0D=0AX-Injected:_yes?=`, which Python's email
package decodes while writing headers), and a policy whose folding refuses to write a
header that would put anything at the start of a new line."""

from __future__ import annotations

import email.policy
import re
import unicodedata
from email.errors import HeaderParseError
from email.header import decode_header
from typing import Any

from broker.errors import InvalidParams

ENCODED_WORD = re.compile(r"=\?[^?\s]+\?[QqBb]\?[^?\s]*\?=")


def _controls(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" for c in text)


def check_header_text(text: str, pointer: str, what: str) -> str:
    """`text` if no control character hides in it, raw or encoded; else InvalidParams."""
    if _controls(text):
        raise InvalidParams(
            pointer, f"{what} holds a control character or line break", "bad_header"
        )
    for word in ENCODED_WORD.findall(text):
        try:
            decoded = "".join(
                part.decode(charset or "ascii", "replace") if isinstance(part, bytes) else part
                for part, charset in decode_header(word)
            )
        except (HeaderParseError, LookupError, ValueError) as exc:
            raise InvalidParams(
                pointer, f"{what} holds an encoded word {word!r} that does not decode", "bad_header"
            ) from exc
        if _controls(decoded):
            raise InvalidParams(
                pointer,
                f"{what} holds an encoded word ({word!r}) that decodes to a control character "
                "or line break; write the text itself",
                "bad_header",
            )
    return text


class StrictSMTP(email.policy.EmailPolicy):
    """email.policy.SMTP whose folded headers are checked before they are written: every
    line after the first must be a continuation (start with a space or a tab) and no
    line may hold a bare CR, LF or NUL; else the message is refused, never sent."""

    def fold(self, name: str, value: Any) -> str:
        return _verified(name, super().fold(name, value), self.linesep)

    def fold_binary(self, name: str, value: Any) -> bytes:
        folded = super().fold_binary(name, value)
        _verified(name, folded.decode("ascii", "surrogateescape"), self.linesep)
        return folded


STRICT_SMTP = StrictSMTP(linesep="\r\n")


def _verified(name: str, folded: str, linesep: str) -> str:
    lines = folded.removesuffix(linesep).split(linesep)
    for i, line in enumerate(lines):
        bad = any(c in line for c in "\r\n\x00") or (i > 0 and line[:1] not in (" ", "\t"))
        if bad:
            raise InvalidParams(
                f"/params/{name.lower()}",
                f"the {name} header would put a line of its own into the message; "
                "write it without line breaks or encoded control characters",
                "bad_header",
            )
    return folded
