"""Neutralising untrusted text before a person sees it, in a terminal or in HTML.

Anything that could hide or fake content is shown visibly instead: ANSI escapes and
other control characters as `\\xNN`/`\\uNNNN`, bidi overrides, zero-width and other
characters that draw nothing or pass for a space (Hangul fillers, the Braille blank,
variation selectors, the grapheme joiner, non-ASCII spaces) as `<U+202E>`-style tags.
Newlines and tabs in bodies are kept.
"""

from __future__ import annotations

import re
import unicodedata

# Bidi controls, zero-width and other invisible format characters.
_INVISIBLE = {
    0x061C, 0x180E, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029,
    0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2060, 0x2061, 0x2062, 0x2063, 0x2064,
    0x2066, 0x2067, 0x2068, 0x2069, 0xFEFF, 0xFFF9, 0xFFFA, 0xFFFB,
}  # fmt: skip
_NAMES = {
    0x202A: "LRE", 0x202B: "RLE", 0x202C: "PDF", 0x202D: "LRO", 0x202E: "RLO",
    0x2066: "LRI", 0x2067: "RLI", 0x2068: "FSI", 0x2069: "PDI", 0x200B: "ZWSP",
    0x200C: "ZWNJ", 0x200D: "ZWJ", 0x200E: "LRM", 0x200F: "RLM", 0xFEFF: "BOM",
    0x2060: "WJ", 0x061C: "ALM",
}  # fmt: skip


def _visible(ch: str) -> str:
    code = ord(ch)
    if code in _NAMES:
        return f"<U+{code:04X} {_NAMES[code]}>"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"<U+{code:04X}>"


# Characters that draw nothing or look like a space while being something else: the
# Unicode default-ignorables (fillers, variation selectors, the grapheme joiner, tags),
# the Braille blank, and every space but U+0020.
_BLANK_RANGES = (
    (0x00A0, 0x00A0), (0x00AD, 0x00AD), (0x034F, 0x034F), (0x115F, 0x1160),
    (0x1680, 0x1680), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x2000, 0x200A),
    (0x202F, 0x202F), (0x205F, 0x205F), (0x2800, 0x2800), (0x3000, 0x3000),
    (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)  # fmt: skip


def _blank(code: int) -> bool:
    return any(low <= code <= high for low, high in _BLANK_RANGES)


def _is_hidden(ch: str, keep_newlines: bool) -> bool:
    if ch in "\n\t" and keep_newlines:
        return False
    code = ord(ch)
    if code < 0x20 or 0x7F <= code < 0xA0 or code in _INVISIBLE or _blank(code):
        return True
    return unicodedata.category(ch) in ("Cf", "Cs", "Co", "Cn") and code > 0x7F


_SUSPECT = (
    r"[\x00-\x1f\x7f-\xa0\xad\u034f\u061c\u115f\u1160\u1680\u17b4\u17b5\u180b-\u180f"
    r"\u2000-\u200f\u2028-\u202f\u205f-\u206f\u2800\u3000\u3164\ufe00-\ufe0f\ufeff\uffa0"
    r"\ufff0-\ufffb\ud800-\udfff\ue000-\uf8ff\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    r"\U000e0000-\U000e0fff]"
)


def neutralize(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every hiding or terminal-controlling character made visible."""
    if text.isascii() and text.isprintable():  # nothing in ASCII hides but controls
        return text
    if not re.search(_SUSPECT, text) and text.isprintable():  # compiled at its first use
        return text
    return "".join(_visible(c) if _is_hidden(c, keep_newlines) else c for c in text)


def terminal(text: str, *, keep_newlines: bool = False) -> str:
    """Neutralised text safe to give to rich: markup brackets escaped too."""
    from rich.markup import escape

    return escape(neutralize(text, keep_newlines=keep_newlines))


def html_text(text: str, *, keep_newlines: bool = True) -> str:
    """Neutralised and HTML-escaped text, for the inbox pages."""
    import html  # the pages' alone: `broker run` prints, it does not render

    return html.escape(neutralize(text, keep_newlines=keep_newlines), quote=True)
