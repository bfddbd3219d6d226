"""github.issue.create, the two comment effects and github.label.add."""

from __future__ import annotations

import pytest

from broker.errors import EffectFailed, InvalidParams
from effects.github import (
    IssueComment,
    IssueCreate,
    LabelAdd,
    PullRequestComment,
    PullRequestCreate,
)
from tests.effects.github.support import REPO, Hub, pr

# -- issues, comments, labels ---------------------------------------------------------------


class TestIssuesCommentsLabels:
    def test_issue_create_and_undo_by_closing(self, hub: Hub) -> None:
        """Stand-in: the fake (state: the issue exists, then is closed as not planned)."""
        params = {"repo": REPO, "title": "Crash in @bob's parser", "body": "x", "labels": ["bug"]}
        preview = IssueCreate().preview(params, hub.ctx())
        assert preview.body == "Crash in @ bob's parser\n\nx"
        out = IssueCreate().apply(params, hub.ctx())
        thread = hub.fake.thread(REPO, out["number"])
        assert (thread["title"], thread["labels"]) == ("Crash in @ bob's parser", ["bug"])
        assert IssueCreate().revert(out, hub.ctx())["closed"] is True
        assert (thread["state"], thread["state_reason"]) == ("closed", "not_planned")
        assert IssueCreate().revert(out, hub.ctx())["closed"] is False

    def test_comment_on_issue_and_pull_request_and_undo(self, hub: Hub) -> None:
        """Stand-in: the fake. Each comment effect accepts its own kind of thread only."""
        issue = IssueCreate().apply({"repo": REPO, "title": "t"}, hub.ctx())["number"]
        hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        pull = PullRequestCreate().apply(pr(), hub.ctx())["number"]
        with pytest.raises(InvalidParams, match=r"is a pull request; use github\.pull_request"):
            IssueComment().apply({"repo": REPO, "number": pull, "body": "b"}, hub.ctx())
        with pytest.raises(InvalidParams, match=r"no pull request #1 \(an issue"):
            PullRequestComment().apply({"repo": REPO, "number": issue, "body": "b"}, hub.ctx())
        preview = PullRequestComment().preview(
            {"repo": REPO, "number": pull, "body": "LGTM @carol"}, hub.ctx()
        )
        assert preview.body == "LGTM @ carol"
        assert dict(preview.facts)["on"] == f"#{pull} Fix x (open)"
        out = PullRequestComment().apply(
            {"repo": REPO, "number": pull, "body": "LGTM @carol"}, hub.ctx()
        )
        assert out["url"].endswith(f"/pull/{pull}#issuecomment-{out['id']}")
        assert PullRequestComment().revert(out, hub.ctx())["deleted"] is True
        assert PullRequestComment().revert(out, hub.ctx())["deleted"] is False
        assert IssueComment().apply({"repo": REPO, "number": issue, "body": "b"}, hub.ctx())

    def test_comment_on_a_locked_issue_fails_with_githubs_words(self, hub: Hub) -> None:
        """Stand-in: the fake (403 for a locked issue, as GitHub answers)."""
        number = IssueCreate().apply({"repo": REPO, "title": "t"}, hub.ctx())["number"]
        hub.fake.thread(REPO, number)["locked"] = True
        with pytest.raises(EffectFailed, match="issue is locked"):
            IssueComment().apply({"repo": REPO, "number": number, "body": "b"}, hub.ctx())

    def test_label_add_adds_only_what_is_missing_and_undo_removes_only_that(self, hub: Hub) -> None:
        """Stand-in: the fake (state: labels already present stay after undo)."""
        issue = IssueCreate().apply({"repo": REPO, "title": "t", "labels": ["bug"]}, hub.ctx())
        params = {"repo": REPO, "number": issue["number"], "labels": ["Bug", "needs review"]}
        facts = dict(LabelAdd().preview(params, hub.ctx()).facts)
        assert (facts["labels now"], facts["added"]) == ("bug", "needs review")
        out = LabelAdd().apply(params, hub.ctx())
        assert out["added"] == ["needs review"] and out["labels"] == ["bug", "needs review"]
        assert LabelAdd().apply(params, hub.ctx())["added"] == []
        assert LabelAdd().revert(out, hub.ctx())["removed"] == ["needs review"]
        assert hub.fake.thread(REPO, issue["number"])["labels"] == ["bug"]
        with pytest.raises(EffectFailed, match="added no label"):
            LabelAdd().revert_preview({**out, "added": []}, hub.ctx())
