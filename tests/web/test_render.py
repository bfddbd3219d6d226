"""Untrusted text in HTML: the same neutralisation as the CLI, with hidden characters marked."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from broker.untrusted import html_text
from broker.web.html import body_lines, shown


@given(st.text())
def test_shown_reads_like_the_clis_html_text(text: str) -> None:
    """Without its marking spans, shown() is exactly render.html_text(), for any text."""
    plain = re.sub(r'<span class="ctl">(.*?)</span>', r"\1", str(shown(text, keep_newlines=True)))
    assert plain == html_text(text, keep_newlines=True)


def test_shown_marks_each_hidden_character() -> None:
    """A bidi override and an escape are wrapped as tags; ordinary text is only escaped."""
    html = str(shown("a\u202eb\x1b<c>"))
    assert html == (
        'a<span class="ctl">&lt;U+202E RLO&gt;</span>b<span class="ctl">\\x1b</span>&lt;c&gt;'
    )


def test_diff_lines_are_classed_by_their_mark() -> None:
    """A unified diff's headers, hunks, additions and removals get their own classes."""
    diff = "--- a\n+++ b\n@@ -1 +1 @@\n-old\n+new\n same\n"
    assert [cls for cls, _ in body_lines(diff, "diff")] == [
        "hdr",
        "hdr",
        "hunk",
        "del",
        "add",
        "ctx",
    ]
    assert [cls for cls, _ in body_lines("+not a diff", "text")] == ["ctx"]
