"""Untrusted text shown to a person: nothing may hide, fake or control what they see."""

from __future__ import annotations

import io
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from broker.untrusted import html_text, neutralize, terminal

# name: (raw text, how it must be shown, the characters that must never appear raw)
HIDING = {
    "ansi clear screen": ("\x1b[2J", "\\x1b[2J", "\x1b"),
    "ansi colour": ("\x1b[31mred", "\\x1b[31mred", "\x1b"),
    "bidi override": ("abc\u202edef", "abc<U+202E RLO>def", "\u202e"),
    "bidi isolate": ("a\u2067b\u2069", "a<U+2067 RLI>b<U+2069 PDI>", "\u2067\u2069"),
    "zero-width joiner": ("a\u200db", "a<U+200D ZWJ>b", "\u200d"),
    "zero-width space": ("a\u200bb", "a<U+200B ZWSP>b", "\u200b"),
    "nul": ("a\x00b", "a\\x00b", "\x00"),
    "bell": ("a\x07b", "a\\x07b", "\x07"),
    "backspace": ("ok\x08\x08no", "ok\\x08\\x08no", "\x08"),
    "delete": ("a\x7fb", "a\\x7fb", "\x7f"),
    "c1 csi": ("a\x9b2Jb", "a\\x9b2Jb", "\x9b"),
    "c1 next line": ("a\x85b", "a\\x85b", "\x85"),
    "soft hyphen": ("a\xadb", "a\\xadb", "\xad"),
    "byte order mark": ("\ufeffx", "<U+FEFF BOM>x", "\ufeff"),
    "line separator": ("a\u2028b", "a<U+2028>b", "\u2028"),
    "lone surrogate": ("a\ud800b", "a<U+D800>b", "\ud800"),
    "private use": ("a\ue000b", "a<U+E000>b", "\ue000"),
    "tag character": ("a\U000e0041b", "a<U+E0041>b", "\U000e0041"),
}


def rich_plain(markup: str) -> str:
    """What a person sees when the CLI's rich console prints `markup`."""
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        highlight=False,
        soft_wrap=True,
        emoji=False,  # as broker.cli.common's consoles
        force_terminal=True,
        color_system=None,
    )
    console.print(markup, end="")
    return buffer.getvalue()


@pytest.mark.parametrize("raw, shown, hidden", list(HIDING.values()), ids=list(HIDING))
def test_neutralize_shows_hiding_characters_visibly(raw: str, shown: str, hidden: str) -> None:
    """Each control, bidi, zero-width or invisible character becomes a visible tag."""
    assert neutralize(raw) == shown


@pytest.mark.parametrize("raw, shown, hidden", list(HIDING.values()), ids=list(HIDING))
def test_no_surface_passes_hiding_characters_raw(raw: str, shown: str, hidden: str) -> None:
    """neutralize, terminal and html_text, newlines kept or not, never emit them raw."""
    outputs = [
        neutralize(raw),
        neutralize(raw, keep_newlines=True),
        terminal(raw),
        terminal(raw, keep_newlines=True),
        html_text(raw),
        html_text(raw, keep_newlines=False),
        rich_plain(terminal(raw)),
    ]
    for out in outputs:
        assert not set(hidden) & set(out), repr(out)


def test_neutralize_leaves_ordinary_text_alone() -> None:
    """Printable text, accents, CJK and emoji pass unchanged."""
    text = "Fix typo in README — café, 日本語, naïve ✅ (#42)"
    assert neutralize(text) == text


def test_every_ascii_control_is_shown_and_every_printable_passes() -> None:
    """The ASCII shortcut (no pattern compiled for plain ASCII lines) hides nothing:
    each of the 33 ASCII controls is shown as \\xNN; the 95 printables pass as they are."""
    for code in range(128):
        ch = chr(code)
        shown = neutralize(f"a{ch}b")
        if code < 0x20 or code == 0x7F:
            assert shown == f"a\\x{code:02x}b"
        else:
            assert shown == f"a{ch}b"


def test_newlines_and_tabs_are_shown_unless_kept() -> None:
    """Newlines and tabs are escaped by default and kept only with keep_newlines."""
    assert neutralize("a\nb\tc") == "a\\x0ab\\x09c"
    assert neutralize("a\nb\tc", keep_newlines=True) == "a\nb\tc"


def test_carriage_return_is_shown_even_when_newlines_are_kept() -> None:
    """A carriage return, which can overwrite a line on screen, is always visible."""
    assert neutralize("safe\rEVIL", keep_newlines=True) == "safe\\x0dEVIL"


def test_unicode_line_separators_are_shown_even_when_newlines_are_kept() -> None:
    """U+2028 and U+2029 are not kept as line breaks: they are shown as tags."""
    assert neutralize("a\u2028b\u2029c", keep_newlines=True) == "a<U+2028>b<U+2029>c"


def test_terminal_escapes_rich_markup() -> None:
    """`[red]x[/]` from a sandbox is printed literally, not as red text."""
    assert rich_plain(terminal("[red]x[/]")) == "[red]x[/]"


@pytest.mark.parametrize(
    "raw",
    [
        "[red]x[/]",
        "[bold]approved[/bold] by security",
        "[link=https://evil.example]docs[/link]",
        "a\\[red]x",
        ":white_check_mark: approved by security",
    ],
    ids=["colour", "bold", "link", "escaped bracket", "emoji code"],
)
def test_terminal_text_is_printed_exactly_as_neutralized(raw: str) -> None:
    """Through the CLI's rich console, terminal() text reads exactly as neutralize() says."""
    assert rich_plain(terminal(raw)) == neutralize(raw)


def test_terminal_escapes_control_characters_before_rich_sees_them() -> None:
    """An ANSI clear-screen inside a reason reaches the console as visible text."""
    shown = rich_plain(terminal("ok\x1b[2J\u202egnp.exe"))
    assert "\x1b" not in shown and "\u202e" not in shown
    assert shown == "ok\\x1b[2J<U+202E RLO>gnp.exe"


def test_html_text_escapes_markup() -> None:
    """A `<script>` tag and quotes are HTML-escaped for the inbox pages."""
    out = html_text("<script>alert(\"x\")</script> & 'y'")
    assert out == "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#x27;y&#x27;"


def test_html_text_keeps_newlines_but_shows_hiding_characters() -> None:
    """In HTML, newlines stay by default; a bidi override becomes an escaped tag."""
    assert html_text("line 1\nline \u202e2") == "line 1\nline &lt;U+202E RLO&gt;2"
    assert html_text("a\nb", keep_newlines=False) == "a\\x0ab"


@settings(max_examples=300, deadline=None)
@given(st.text(), st.booleans())
def test_neutralize_output_holds_no_invisible_or_control_characters(
    text: str, keep_newlines: bool
) -> None:
    """For any input, the output holds only visible characters (and kept \\n, \\t)."""
    out = neutralize(text, keep_newlines=keep_newlines)
    allowed = {"\n", "\t"} if keep_newlines else set()
    for ch in out:
        if ch in allowed:
            continue
        assert unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co", "Cn"), repr(ch)
        assert ch not in "\u2028\u2029"


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_neutralize_is_idempotent(text: str) -> None:
    """Neutralising twice changes nothing more: the visible form is stable."""
    once = neutralize(text)
    assert neutralize(once) == once
