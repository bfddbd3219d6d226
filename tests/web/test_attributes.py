"""Finding 11 (web): the visible-control markup (`<span class="ctl">`) is for text; an
attribute gets the neutralised plain text, escaped. Every page is parsed and every
attribute value of every element checked, with hostile text in each query parameter."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from tests.web.conftest import Web

HOSTILE = "\u202eevil\u200b\x1b[31m\"'><b>x"


class Attributes(HTMLParser):
    """Every (tag, attribute, value) of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.extend((tag, name, value or "") for name, value in attrs)


def attributes(page: str) -> list[tuple[str, str, str]]:
    parser = Attributes()
    parser.feed(page)
    return parser.found


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/", {"q": HOSTILE, "effect": HOSTILE, "sandbox": HOSTILE}),
        ("/history", {"sandbox": HOSTILE, "effect": HOSTILE, "status": HOSTILE, "q": HOSTILE}),
        ("/login", {"next": "/" + HOSTILE}),
    ],
)
def test_no_markup_inside_any_attribute(web: Web, path: str, params: dict[str, str]) -> None:
    """Hostile text in every parameter of the list, history and sign-in pages: no
    attribute holds markup or a raw control character, and the page grew no element."""
    web.gated()
    browser = web.browser() if path != "/login" else web.client(None)
    page = browser.get(path, params=params).text
    found = attributes(page)
    assert found, page[:500]
    bad = [
        (tag, name, value)
        for tag, name, value in found
        if "<span" in value or '"' in name or any(c in value for c in "\u202e\u200b\x1b")
    ]
    assert bad == []
    assert "<b>x" not in page
