"""github.pull_request.create, from a pushed branch and from files the host commits."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from broker.errors import EffectFailed, InvalidParams
from effects.github import PullRequestCreate
from tests.effects.github.fake import commit_on, git
from tests.effects.github.support import FILES, PULLS, REPO, Hub, posted, pr

# -- github.pull_request.create: a pushed branch ----------------------------------------------


class TestPullRequestFromBranch:
    def test_preview_shows_the_compare_diff_and_the_text(self, hub: Hub) -> None:
        """Stand-in: the fake (its compare answer is git's diff of the real repository)."""
        head = hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        preview = PullRequestCreate().preview(pr(body="cc @alice"), hub.ctx())
        assert "-x = 1\n+x = 2" in preview.body
        assert "diff --git a/src/app.py b/src/app.py" in preview.body
        assert "cc @ alice" in preview.body and "agent change" in preview.body
        facts = dict(preview.facts)
        assert facts["head"] == f"agent/fix @ {head[:12]}"
        assert facts["base"].startswith("main @ ")
        assert "alice" in facts["mentions neutralised"]

    def test_apply_opens_one_pull_request_with_labels_and_reviewers(self, hub: Hub) -> None:
        """Stand-in: the fake. The PR is opened once; labels and reviewers follow it."""
        hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        params = pr(body="Fixes x, thanks @bob", labels=["bug"], reviewers=["alice", "acme/core"])
        out = PullRequestCreate().apply(params, hub.ctx())
        assert out["created"] is True and out["warnings"] == []
        assert out["url"] == f"{hub.fake.url}/acme/api/pull/{out['number']}"
        assert out["mentions_neutralised"] == ["bob"]
        assert posted(hub, PULLS) == [
            {
                "head": "agent/fix",
                "base": "main",
                "title": "Fix x",
                "body": "Fixes x, thanks @ bob",
                "draft": False,
            }
        ]
        thread = hub.fake.thread(REPO, out["number"])
        assert thread["labels"] == ["bug"]
        assert (thread["reviewers"], thread["teams"]) == (["alice"], ["core"])

    def test_an_open_pull_request_is_returned_not_duplicated(self, hub: Hub) -> None:
        """Stand-in: the fake (state: the first PR is still open on the second apply)."""
        hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        first = PullRequestCreate().apply(pr(), hub.ctx("r1"))
        preview = PullRequestCreate().preview(pr(), hub.ctx("r2"))
        assert "applying returns it" in dict(preview.facts)["already open"]
        again = PullRequestCreate().apply(pr(), hub.ctx("r2"))
        assert again["number"] == first["number"] and again["created"] is False
        assert len(hub.fake.pulls(REPO)) == 1 and len(posted(hub, PULLS)) == 1

    def test_base_moved_since_the_approver_saw_it_fails(self, hub: Hub) -> None:
        """Stand-in: the fake (state: main moves between preview and apply)."""
        hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        ctx = hub.ctx()
        PullRequestCreate().preview(pr(), ctx)
        commit_on(hub.remote, "main", {"README.md": b"moved\n"}, "someone else")
        with pytest.raises(EffectFailed, match="main in acme/api moved since the approver saw it"):
            PullRequestCreate().apply(pr(), ctx)
        assert hub.fake.pulls(REPO) == []

    def test_head_moved_since_the_approver_saw_it_fails(self, hub: Hub) -> None:
        """Stand-in: the fake (state: the agent pushes again after the preview)."""
        hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        ctx = hub.ctx()
        PullRequestCreate().preview(pr(), ctx)
        hub.push("agent/fix", {"src/app.py": "x = 3\n"})
        with pytest.raises(EffectFailed, match="agent/fix in acme/api moved since the approver"):
            PullRequestCreate().apply(pr(), ctx)
        assert hub.fake.pulls(REPO) == []

    def test_agents_base_sha_is_shown_and_enforced_without_an_approver(self, hub: Hub) -> None:
        """Stand-in: the fake. A stale base_sha is a preview fact, and fails an auto apply."""
        old = str(hub.sha("main"))
        hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        new = commit_on(hub.remote, "main", {"README.md": b"moved\n"}, "someone else")
        preview = PullRequestCreate().preview(pr(base_sha=old), hub.ctx("seen"))
        assert dict(preview.facts)["base moved"] == (
            f"main is at {new[:12]} now; the agent worked from {old[:12]}"
        )
        with pytest.raises(EffectFailed, match=f"send the request again with base_sha {new}"):
            PullRequestCreate().apply(pr(base_sha=old), hub.ctx("auto"))
        out = PullRequestCreate().apply(pr(base_sha=new), hub.ctx("auto2"))
        assert out["created"] is True

    def test_a_missing_head_branch_says_to_push_it(self, hub: Hub) -> None:
        """Stand-in: the fake. Without the branch, preview and apply say how to fix it."""
        with pytest.raises(EffectFailed, match=r"push it with git\.push first"):
            PullRequestCreate().apply(pr(), hub.ctx())

    def test_warnings_when_labels_or_reviewers_fail_after_the_pr(self, hub: Hub) -> None:
        """Stand-in: the fake (it refuses non-collaborators, as GitHub does, with 422)."""
        hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        out = PullRequestCreate().apply(pr(reviewers=["mallory"]), hub.ctx())
        assert out["created"] is True
        assert len(out["warnings"]) == 1
        assert "requesting reviewers" in out["warnings"][0]
        assert "may only be requested from collaborators" in out["warnings"][0]

    def test_revert_closes_the_pull_request(self, hub: Hub) -> None:
        """Stand-in: the fake. Undo closes an open PR; the pushed branch is not ours to delete."""
        hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        handler = PullRequestCreate()
        out = handler.apply(pr(), hub.ctx())
        assert "close pull request" in handler.revert_preview(out, hub.ctx()).title
        assert handler.revert(out, hub.ctx()) == {
            "number": out["number"],
            "closed": True,
            "branch_deleted": False,
        }
        assert hub.fake.thread(REPO, out["number"])["state"] == "closed"
        assert hub.sha("agent/fix") is not None

    def test_revert_refuses_what_it_did_not_create_or_was_merged(self, hub: Hub) -> None:
        """Stand-in: the fake. A found PR is not undone by this request; a merged one cannot be."""
        hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        handler = PullRequestCreate()
        out = handler.apply(pr(), hub.ctx("r1"))
        found = handler.apply(pr(), hub.ctx("r2"))
        with pytest.raises(EffectFailed, match="did not create it"):
            handler.revert_preview(found, hub.ctx())
        hub.fake.thread(REPO, out["number"])["merged"] = True
        with pytest.raises(EffectFailed, match="was merged"):
            handler.revert(out, hub.ctx())


# -- github.pull_request.create: files the host commits ----------------------------------------


class TestPullRequestFromFiles:
    def test_preview_diffs_each_file_against_the_base(self, hub: Hub) -> None:
        """Stand-in: the fake (blobs and trees of the real repository)."""
        preview = PullRequestCreate().preview(pr(head="agent/docs", files=FILES), hub.ctx())
        assert "-hello\n+hello, world\n" in preview.body
        assert "new file mode 100644\n--- /dev/null\n+++ b/docs/new/page.md" in preview.body
        assert "deleted file mode 100644\n--- a/src/app.py\n+++ /dev/null\n" in preview.body
        assert dict(preview.facts)["files"] == "3 (0 unchanged)"

    def test_apply_commits_on_a_new_branch_from_base_and_opens_the_pr(self, hub: Hub) -> None:
        """Stand-in: the fake (Git Data API over a real repository: blobs, tree, commit, ref)."""
        base = hub.sha("main")
        ctx = hub.ctx()
        PullRequestCreate().preview(pr(head="agent/docs", files=FILES), ctx)
        out = PullRequestCreate().apply(
            pr(head="agent/docs", files=FILES, commit_message="docs for @bob"), ctx
        )
        assert out["created"] is True and out["branch_created"] is True
        head = hub.sha("agent/docs")
        assert out["head_sha"] == head
        assert git(hub.remote, "rev-parse", f"{head}^").strip() == base
        assert hub.show("agent/docs", "README.md") == "hello, world\n"
        assert hub.show("agent/docs", "docs/new/page.md") == "new\n"
        assert "src/app.py" not in git(hub.remote, "ls-tree", "-r", "--name-only", "agent/docs")
        assert git(hub.remote, "log", "-1", "--format=%s", "agent/docs").strip() == (
            "docs for @ bob"
        )
        tree = posted(hub, "/repos/{owner}/{repo}/git/trees")[0]["tree"]
        assert {"path": "src/app.py", "mode": "100644", "type": "blob", "sha": None} in tree

    def test_a_blob_changed_since_the_approver_saw_it_fails(self, hub: Hub) -> None:
        """Stand-in: the fake (state: README.md changes on main after the preview)."""
        ctx = hub.ctx()
        PullRequestCreate().preview(pr(head="agent/docs", files=FILES), ctx)
        commit_on(hub.remote, "main", {"README.md": b"other\n"}, "someone else")
        with pytest.raises(EffectFailed, match="moved since the approver saw it"):
            PullRequestCreate().apply(pr(head="agent/docs", files=FILES), ctx)
        assert hub.sha("agent/docs") is None and hub.fake.pulls(REPO) == []

    def test_a_file_changed_since_the_agents_base_sha_is_a_conflict(self, hub: Hub) -> None:
        """Stand-in: the fake. Content written against an old README would revert others' work."""
        old = str(hub.sha("main"))
        commit_on(hub.remote, "main", {"README.md": b"theirs\n"}, "someone else")
        params = pr(head="agent/docs", files=FILES[:1], base_sha=old)
        ctx = hub.ctx()
        preview = PullRequestCreate().preview(params, ctx)
        assert (
            "README.md changed on main since base_sha"
            in dict(preview.facts)["CONFLICT (applying will fail)"]
        )
        with pytest.raises(EffectFailed, match=r"README\.md changed on main since base_sha"):
            PullRequestCreate().apply(params, ctx)
        assert hub.sha("agent/docs") is None

    def test_an_unrelated_change_on_base_is_no_conflict(self, hub: Hub) -> None:
        """Stand-in: the fake. base_sha is stale but the agent's files did not change since."""
        old = str(hub.sha("main"))
        commit_on(hub.remote, "main", {"docs/guide.md": b"# Guide 2\n"}, "someone else")
        params = pr(head="agent/docs", files=FILES[:1], base_sha=old)
        ctx = hub.ctx()
        assert "CONFLICT (applying will fail)" not in dict(
            PullRequestCreate().preview(params, ctx).facts
        )
        assert PullRequestCreate().apply(params, ctx)["created"] is True

    def test_a_retry_reuses_the_branch_it_made(self, hub: Hub) -> None:
        """Stand-in: the fake (a fault: POST pulls answers 502 once, after the branch exists)."""
        hub.fake.fault("POST", PULLS, 502, {"message": "Server Error"})
        params = pr(head="agent/docs", files=FILES)
        with pytest.raises(EffectFailed, match="GitHub broke"):
            PullRequestCreate().apply(params, hub.ctx())
        branch = hub.sha("agent/docs")
        out = PullRequestCreate().apply(params, hub.ctx())
        assert out["created"] is True and out["branch_created"] is True
        assert hub.sha("agent/docs") == branch == out["head_sha"]
        assert len(posted(hub, "/repos/{owner}/{repo}/git/refs")) == 1

    def test_an_existing_head_with_other_commits_is_refused(self, hub: Hub) -> None:
        """Stand-in: the fake. files never write onto a branch that holds something else."""
        hub.push("agent/docs", {"other.txt": "x\n"})
        with pytest.raises(EffectFailed, match="already exists in acme/api with other commits"):
            PullRequestCreate().apply(pr(head="agent/docs", files=FILES), hub.ctx())
        assert hub.fake.pulls(REPO) == []

    def test_files_that_change_nothing_are_refused(self, hub: Hub) -> None:
        """Stand-in: the fake. The same bytes as the base: preview says so, apply fails."""
        same = [{"path": "README.md", "content": "hello\n"}]
        facts = dict(PullRequestCreate().preview(pr(files=same), hub.ctx()).facts)
        assert facts["files"] == "1 (1 unchanged)" and "NO CHANGES" in facts
        with pytest.raises(EffectFailed, match="change nothing"):
            PullRequestCreate().apply(pr(files=same), hub.ctx())

    def test_unwritable_paths_fail_with_the_reason(self, hub: Hub) -> None:
        """Stand-in: the fake. Below a file, a directory, a missing file to delete."""
        cases = [
            ({"path": "README.md/x", "content": "x"}, "README.md is a file in acme/api"),
            ({"path": "docs", "content": "x"}, "docs is a directory on the base"),
            ({"path": "gone.txt", "delete": True}, "gone.txt does not exist on the base"),
        ]
        for item, reason in cases:
            with pytest.raises(EffectFailed, match=reason):
                PullRequestCreate().apply(pr(files=[item]), hub.ctx())

    @pytest.mark.parametrize(
        ("item", "message"),
        [
            ({"path": "../x", "content": "x"}, "without '.', '..' or .git"),
            ({"path": ".git/config", "content": "x"}, "without '.', '..' or .git"),
            ({"path": "/etc/passwd", "content": "x"}, "without '.', '..' or .git"),
            ({"path": "a", "content_b64": "***"}, "not valid base64"),
            ({"path": "a", "content": "x", "delete": True}, "exactly one of"),
        ],
    )
    def test_bad_files_are_invalid_before_any_call(
        self, hub: Hub, item: dict[str, Any], message: str
    ) -> None:
        """Stand-in: none (refused at check). Paths stay inside the repository."""
        with pytest.raises(InvalidParams, match=message):
            PullRequestCreate().check(pr(files=[item]), hub.ctx())
        assert hub.fake.calls == []

    def test_binary_content_is_described_not_dumped(self, hub: Hub) -> None:
        """Stand-in: the fake. A binary file shows as sizes; it is committed byte for byte."""
        files = [{"path": "logo.png", "content_b64": "iVBORw0KGgoAAAANSUhEUgA="}]
        assert "Binary files differ (0 → 17 bytes)" in (
            PullRequestCreate().preview(pr(head="agent/logo", files=files), hub.ctx()).body
        )
        PullRequestCreate().apply(pr(head="agent/logo", files=files), hub.ctx())
        shown = subprocess.run(
            ["git", "--git-dir", str(hub.remote), "show", "agent/logo:logo.png"],
            capture_output=True,
            check=True,
        ).stdout
        assert shown.startswith(b"\x89PNG")

    def test_revert_closes_the_pr_and_deletes_the_branch_it_made(self, hub: Hub) -> None:
        """Stand-in: the fake. The branch goes only while it still holds the host's commit."""
        handler = PullRequestCreate()
        out = handler.apply(pr(head="agent/docs", files=FILES), hub.ctx())
        assert "delete branch agent/docs" in handler.revert_preview(out, hub.ctx()).title
        done = handler.revert(out, hub.ctx())
        assert done == {"number": out["number"], "closed": True, "branch_deleted": True}
        assert hub.sha("agent/docs") is None
        other = handler.apply(pr(head="agent/two", files=FILES), hub.ctx("r2"))
        hub.push("agent/two", {"more.txt": "more\n"})
        assert handler.revert(other, hub.ctx())["note"] == (
            "agent/two moved since; it was left in place"
        )
        assert hub.sha("agent/two") is not None
