"""Mentions in the agent's text: visible and inert unless allowed."""

from __future__ import annotations

import pytest

from effects import github as gh
from effects.github import IssueCreate
from tests.effects.github.support import REPO, Hub, posted

# -- mentions ----------------------------------------------------------------------------


class TestMentions:
    @pytest.mark.parametrize(
        ("text", "out", "names"),
        [
            ("thanks @bob!", "thanks @ bob!", ["bob"]),
            ("cc @acme/core", "cc @ acme/core", ["acme/core"]),
            ("(@bob) -@carol", "(@ bob) -@ carol", ["bob", "carol"]),
            ("mail bob@example.com", "mail bob@example.com", []),
            ("&#64;bob &#x40;eve &commat;mal", "@ bob @ eve @ mal", ["bob", "eve", "mal"]),
            ("see https://x.com/@bob and @bob", "see https://x.com/@bob and @ bob", ["bob"]),
            ("```\n@cache\n```", "```\n@ cache\n```", ["cache"]),
            ("an @ alone, @@bob", "an @ alone, @@ bob", ["bob"]),
        ],
    )
    def test_mentions_become_visible_and_inert(self, text: str, out: str, names: list[str]) -> None:
        """Every @name GitHub would link is posted as '@ name'; e-mails and URLs stay."""
        assert gh.neutralise(text) == (out, names)

    def test_allow_mentions_posts_text_unchanged(self, hub: Hub) -> None:
        """Stand-in: the fake (it records the posted body). allow_mentions keeps @bob live."""
        params = {"repo": REPO, "title": "ping @bob", "body": "@carol"}
        out = IssueCreate().apply(params, hub.ctx(allow_mentions=True))
        assert out["mentions_neutralised"] == []
        assert posted(hub, "/repos/{owner}/{repo}/issues") == [
            {"title": "ping @bob", "body": "@carol"}
        ]
