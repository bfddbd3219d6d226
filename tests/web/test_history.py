"""The history page's search and date range, its order (by the time each row shows), and
its CSV export for audits (neutralised, no spreadsheet formulas)."""

from __future__ import annotations

import csv
import io

from broker.web.history import _cell
from tests.web.conftest import Web
from tests.web.test_pages import form_post


def test_history_searches_ranges_sorts_and_exports(web: Web) -> None:
    """Two decided requests: newest decided first; a search narrows to one; a range that
    ends before today shows none; the CSV holds the same rows, a formula defused."""
    first, second = web.gated(), web.gated()
    browser = web.browser()
    form_post(web, browser, second, verdict="deny", reason="=cmd|' /C calc'!A0")
    form_post(web, browser, first, verdict="deny", reason="not today")
    web.harness.wait(first["id"])
    page = browser.get("/history").text
    assert page.index(first["id"]) < page.index(second["id"])  # decided last, shown first
    only = browser.get("/history", params={"q": "NOT TODAY"}).text
    assert first["id"] in only and second["id"] not in only
    old = browser.get("/history", params={"since": "2020-01-01", "until": "2020-01-02"}).text
    assert "No decisions match." in old
    exported = browser.get("/history.csv", params={"q": "calc"})
    assert exported.headers["content-type"].startswith("text/csv")
    header, *rows = list(csv.reader(io.StringIO(exported.text)))
    assert header[:5] == ["when", "ref", "effect", "what", "outcome"]
    assert [(r[1], r[4], r[6]) for r in rows] == [(f"default/{second['id']}", "denied", "alice")]
    assert rows[0][7] == "denied by alice: =cmd|' /C calc'!A0"
    assert _cell("=cmd|' /C calc'!A0") == "'=cmd|' /C calc'!A0"  # never run as a formula
    assert web.client(None).get("/history.csv", follow_redirects=False).status_code == 303
