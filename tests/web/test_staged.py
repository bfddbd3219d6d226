"""The web inbox over a broker in staged mode: staged requests in the history, the API's
request list and stats, and on their own page with the verdict and the preview; none
of them waits in the inbox."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.staged import EVERY
from broker.web.server import WebServer
from tests.web.conftest import RECORD_REASON, Switch, Web, _harness, _plugged


@pytest.fixture
def staged_web(tmp_path: Path, exports: Path, served: tuple[Switch, WebServer]) -> Iterator[Web]:
    """A broker staging every effect, and its web inbox."""
    h = _harness(tmp_path, exports)
    h.config = h.config._replace(staged=EVERY)
    with h:
        yield from _plugged(h, served)


def test_staged_requests_show_in_history_stats_and_their_page(staged_web: Web) -> None:
    """A would-be approval and a would-be auto are both staged: counted, listed under the
    `staged` outcome, not waiting; the page shows the preview and the rule that decided."""
    h = staged_web.harness
    gated = h.submit(h.request("test.record", {"value": "hello"}))
    write = h.submit(h.request("files.write", {"path": "new.txt", "content": "fresh words"}))
    assert gated["status"] == write["status"] == "staged"
    api = staged_web.client()
    stats = api.get("/api/v1/stats").json()
    assert stats["effects"]["test.record"]["counts"]["staged"] == 1
    assert stats["overall"]["counts"]["staged"] == 2
    assert stats["overall"]["counts"]["approved"] == stats["overall"]["counts"]["waiting"] == 0
    listed = api.get("/api/v1/requests", params={"status": "staged"}).json()["requests"]
    assert {r["id"] for r in listed} == {gated["id"], write["id"]}
    assert api.get("/api/v1/pending").json()["requests"] == []
    browser = staged_web.browser()
    history = browser.get("/history", params={"outcome": "staged"}).text
    assert gated["id"] in history and write["id"] in history
    assert 'value="staged"' in history  # among the outcomes one can filter by
    page = browser.get(f"/requests/default/{gated['id']}").text
    assert "Outcome: staged" in page and "nothing was applied" in page
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    assert f"rules[0] : {RECORD_REASON}" in re.sub(r"\s+", " ", text)
    assert "record 'hello'" in text  # the preview's title, from the card
    assert not (h.base.parent / "exports" / "default" / "new.txt").exists()
