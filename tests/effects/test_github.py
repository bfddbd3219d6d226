"""github.* against two stand-ins on 127.0.0.1, each named in every test's docstring.

- the fake (tests/effects/github_fake.py): a recording GitHub with state, backed by a
  real bare repository, for behaviour that depends on state (idempotency, a base or blob
  that moved, undo) and for faults;
- Prism serving GitHub's official OpenAPI description (scripts/prism-up.sh), stateless,
  which rejects any request that does not match GitHub's schema: every REST call the
  handlers make is sent to it. Without Prism those tests skip, and say why; with CI set
  they fail instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from github import GithubException

from broker.approval import card, decide, nudge
from broker.errors import ConfigError, EffectFailed, InvalidParams
from broker.ledger import Ledger
from broker.testing import BrokerHarness, make_context
from effects import github as gh
from effects.base import Context
from effects.github import (
    APP_TOKEN_CALL,
    Api,
    IssueComment,
    IssueCreate,
    LabelAdd,
    PullRequestComment,
    PullRequestCreate,
)
from tests.effects.conftest_github import (
    GITHUB_SPEC_FILE,
    Prism,
    RecordingProxy,
    free_port,
    installed,
    subset_spec,
)
from tests.effects.github_fake import FakeGitHub, commit_on, git, seed_repo

gh_errors = importlib.import_module("github.GithubException")
TOKEN_ENV = "TEST_BROKER_GITHUB_TOKEN"
TOKEN = "ghp_testtoken0123456789notreal"
REPO = "acme/api"
SEED = {"README.md": "hello\n", "src/app.py": "x = 1\n", "docs/guide.md": "# Guide\n"}


# -- fixtures ---------------------------------------------------------------------------


@dataclass
class Hub:
    """A fake GitHub serving acme/api, backed by a bare repository with a main branch."""

    fake: FakeGitHub
    remote: Path
    state: Path
    settings: dict[str, Any]

    def ctx(self, request_id: str = "r1", **settings: Any) -> Context:
        """A handler's context; settings given here override the hub's (None: removed)."""
        table = {k: v for k, v in {**self.settings, **settings}.items() if v is not None}
        return make_context(
            table,
            integration="github",
            sandbox="sb",
            request_id=request_id,
            request_sha256=hashlib.sha256(request_id.encode()).hexdigest(),
            state_dir=self.state,
        )

    def sha(self, branch: str) -> str | None:
        try:
            return git(self.remote, "rev-parse", "--verify", "--quiet", branch).strip() or None
        except Exception:
            return None

    def show(self, rev: str, path: str) -> str:
        return git(self.remote, "show", f"{rev}:{path}")

    def push(self, branch: str, files: dict[str, str | None], start: str = "main") -> str:
        """What an agent's git.push leaves on the remote: a branch with one commit."""
        data = {p: (c.encode() if c is not None else None) for p, c in files.items()}
        return commit_on(self.remote, branch, data, "agent change", start=start)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    """The fake GitHub with acme/api; the token only in the environment."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    remote = tmp_path / "api.git"
    seed_repo(remote, SEED)
    state = tmp_path / "state"
    state.mkdir()
    with FakeGitHub(token=TOKEN) as fake:
        fake.add_repo(REPO, remote)
        settings = {"token_env": TOKEN_ENV, "base_url": fake.url, "repos": ["acme/*"]}
        yield Hub(fake, remote, state, settings)


def pr(**kw: Any) -> dict[str, Any]:
    return {"repo": REPO, "head": "agent/fix", "base": "main", "title": "Fix x", **kw}


def posted(hub: Hub, route: str) -> list[Any]:
    return [c.body for c in hub.fake.called("POST", route)]


PULLS = "/repos/{owner}/{repo}/pulls"


# -- configuration ------------------------------------------------------------------------


class TestConfig:
    def test_token_and_app_settings_are_accepted(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A token reference, or the three App keys, make a valid [integrations.github]."""
        monkeypatch.setenv(TOKEN_ENV, TOKEN)
        gh.check_settings({"token_env": TOKEN_ENV, "repos": ["acme/*"], "allow_mentions": True})
        gh.check_settings({"app_id": 1, "private_key_file": "k.pem", "installation_id": 2})

    @pytest.mark.parametrize(
        ("settings", "key"),
        [
            ({"tokn_env": "X"}, "tokn_env"),
            ({"base_url": "http://github.example.com/api/v3"}, "base_url"),
            ({"base_url": "ftp://x"}, "base_url"),
            ({"repos": "acme/*"}, "repos"),
            ({"repos": ["acme"]}, "repos"),
            ({"allow_mentions": "no"}, "allow_mentions"),
            ({"timeout": 0}, "timeout"),
            ({"token_env": "UNSET_BROKER_TEST_VAR"}, "token_env"),
            ({"token_env": TOKEN_ENV, "app_id": 1}, "app_id"),
            ({"app_id": 1, "installation_id": 2}, "private_key_file"),
            ({"app_id": "1", "private_key_file": "k", "installation_id": 2}, "app_id"),
        ],
    )
    def test_broken_settings_name_the_key(
        self, settings: dict[str, Any], key: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Each broken setting stops the broker with a message naming its key."""
        monkeypatch.setenv(TOKEN_ENV, TOKEN)
        with pytest.raises(ConfigError, match=rf"integrations\.github\.{key}"):
            gh.check_settings(settings)

    def test_plain_http_is_allowed_for_loopback_only(self) -> None:
        """http:// is refused unless the host is 127.0.0.1, ::1 or localhost."""
        for url in ("http://127.0.0.1:9", "http://localhost:9", "http://[::1]:9"):
            gh.check_settings({"base_url": url})

    def test_missing_credentials_fail_with_a_sentence(self, hub: Hub) -> None:
        """Stand-in: the fake. Without any credential the effect fails, naming the keys."""
        with pytest.raises(EffectFailed, match="not configured on this host"):
            IssueCreate().apply({"repo": REPO, "title": "t"}, hub.ctx(token_env=None))

    def test_repo_outside_the_allowlist_is_invalid(self, hub: Hub) -> None:
        """Stand-in: none (refused before any call). repos = ['acme/*'] allows no other."""
        with pytest.raises(InvalidParams, match="not among the repositories"):
            IssueCreate().check({"repo": "other/api", "title": "t"}, hub.ctx())
        IssueCreate().check({"repo": "ACME/Api", "title": "t"}, hub.ctx())
        with pytest.raises(InvalidParams, match="not owner/name"):
            IssueCreate().check({"repo": "acme/..", "title": "t"}, hub.ctx())
        assert hub.fake.calls == []


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


FILES = [
    {"path": "README.md", "content": "hello, world\n"},
    {"path": "docs/new/page.md", "content": "new\n"},
    {"path": "src/app.py", "delete": True},
]


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


# -- the edge: errors an agent can act on ---------------------------------------------------


class TestErrors:
    @pytest.mark.parametrize(
        ("status", "body", "headers", "reason"),
        [
            (401, {"message": "Bad credentials"}, {}, "refused the host's credentials"),
            (
                403,
                {"message": "API rate limit exceeded for installation ID 1."},
                {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "4102444800"},
                "rate limit stopped .* resets at 2100-01-01T00:00:00Z",
            ),
            (
                403,
                {"message": "You have exceeded a secondary rate limit."},
                {"Retry-After": "60"},
                "resets in 60 s",
            ),
            (429, {"message": "Too many requests"}, {}, "rate limit"),
            (
                403,
                {"message": "Resource not accessible by integration"},
                {},
                "Resource not accessible by integration.*lack the permission",
            ),
            (404, {"message": "Not Found"}, {}, "answered 404 .* cannot see it"),
            (409, {"message": "Git Repository is empty."}, {}, "conflict .*empty"),
            (410, {"message": "Issues are disabled for this repo"}, {}, "gone or disabled"),
            (
                422,
                {"message": "Validation Failed", "errors": [{"field": "title", "code": "missing"}]},
                {},
                "as invalid .*Validation Failed; title missing",
            ),
            (500, {"message": "boom"}, {}, "GitHub broke .* may or may not have happened"),
        ],
    )
    def test_github_answers_become_reasons(
        self, hub: Hub, status: int, body: Any, headers: dict[str, str], reason: str
    ) -> None:
        """Stand-in: the fake (a fault per case). Each status gets a sentence, not a trace."""
        hub.fake.fault("POST", "/repos/{owner}/{repo}/issues", status, body, headers=headers)
        with pytest.raises(EffectFailed, match=reason) as caught:
            IssueCreate().apply({"repo": REPO, "title": "t"}, hub.ctx())
        assert caught.value.reason.startswith("failed: ")
        assert TOKEN not in caught.value.reason
        assert isinstance(caught.value.__cause__, gh_errors.GithubException)

    def test_a_wrong_token_is_a_credentials_failure(
        self, hub: Hub, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Stand-in: the fake (it answers 401 Bad credentials to another token)."""
        monkeypatch.setenv(TOKEN_ENV, "ghp_wrong")
        with pytest.raises(EffectFailed, match="refused the host's credentials") as caught:
            IssueCreate().apply({"repo": REPO, "title": "t"}, hub.ctx())
        assert isinstance(caught.value.__cause__, gh_errors.BadCredentialsException)

    def test_an_unknown_repository_is_not_found(self, hub: Hub) -> None:
        """Stand-in: the fake (it serves acme/api only)."""
        with pytest.raises(EffectFailed, match="404"):
            IssueCreate().apply({"repo": "acme/nope", "title": "t"}, hub.ctx())

    def test_connection_refused_and_timeout(self, hub: Hub) -> None:
        """Stand-ins: a closed port, and the fake answering after the 1 s timeout."""
        closed = f"http://127.0.0.1:{free_port()}"
        with pytest.raises(EffectFailed, match=f"cannot connect to {closed} from the host"):
            IssueCreate().apply({"repo": REPO, "title": "t"}, hub.ctx(base_url=closed))
        hub.fake.fault("POST", "/repos/{owner}/{repo}/issues", 201, delay=1.5)
        with pytest.raises(EffectFailed, match="did not answer in time; it may or may not"):
            IssueCreate().apply({"repo": REPO, "title": "t"}, hub.ctx(timeout=1))

    def test_every_pygithub_exception_has_its_own_reason(self) -> None:
        """Stand-in: none. Each class PyGithub defines is mapped by name, none by accident."""
        defined: set[type[GithubException]] = {
            cls
            for _, cls in inspect.getmembers(gh_errors, inspect.isclass)
            if issubclass(cls, GithubException) and cls.__module__ == gh_errors.__name__
        }
        assert defined == set(gh._GITHUB_REASONS)
        for cls in defined:
            exc = cls(500 if cls is GithubException else 403, {"message": "m"}, {})
            reason = gh.translate(exc, "doing it", "https://api.github.com").reason
            assert reason.startswith("failed: ") and "doing it" in reason, cls
        bad = gh_errors.BadAttributeException(1, str, None)
        assert "unexpected type" in gh.translate(bad, "x", "u").reason

    def test_every_requests_exception_is_translated(self) -> None:
        """Stand-in: none. Every requests error maps to a reason naming the host's URL."""
        classes = [
            cls
            for _, cls in inspect.getmembers(requests.exceptions, inspect.isclass)
            if issubclass(cls, requests.RequestException)
        ]
        assert len(classes) > 15
        for cls in classes:
            exc = cls("x", "", 0) if cls is requests.exceptions.JSONDecodeError else cls("x")
            reason = gh.translate(exc, "doing it", "https://ghe.example/api/v3").reason
            assert reason.startswith("failed: doing it: ") and "ghe.example" in reason, cls

    def test_the_edge_lets_effect_failures_through_and_keeps_the_cause(self) -> None:
        """Stand-in: none. edge() re-raises EffectFailed as is and chains what it translates."""
        with pytest.raises(EffectFailed, match="mine"), gh.edge("x", "u"):
            raise EffectFailed("failed: mine")
        with pytest.raises(EffectFailed) as caught, gh.edge("x", "u"):
            raise gh_errors.UnknownObjectException(404, {"message": "Not Found"}, {})
        assert isinstance(caught.value.__cause__, gh_errors.UnknownObjectException)


# -- GitHub App credentials ----------------------------------------------------------------


def app_key(tmp_path: Path) -> tuple[Path, str]:
    """A fresh RSA key for a test GitHub App: (private key file, public key PEM)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path / "app.pem"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return path, public.decode()


def test_github_app_credentials_get_an_installation_token(tmp_path: Path, hub: Hub) -> None:
    """Stand-in: the fake (it checks the App's JWT with the public key, then the token)."""
    key_file, public = app_key(tmp_path)
    hub.fake.app = (4242, public, 77)
    settings: dict[str, Any] = {
        "app_id": 4242,
        "private_key_file": str(key_file),
        "installation_id": 77,
    }
    ctx = hub.ctx(token_env=None, repos=None, **settings)
    out = IssueCreate().apply({"repo": REPO, "title": "from the app"}, ctx)
    assert out["number"] == 1
    token_calls = hub.fake.called("POST", APP_TOKEN_CALL[1])
    assert [c.status for c in token_calls] == [201]
    assert hub.fake.called("POST", "/repos/{owner}/{repo}/issues")[0].auth.startswith("token ghs_")
    key_file.write_text("not a key")
    with pytest.raises(EffectFailed, match="private key cannot sign"):
        IssueCreate().apply({"repo": REPO, "title": "t"}, ctx)


# -- end to end: an agent pushes, asks for a PR, a person approves ---------------------------

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Agent",
    "GIT_AUTHOR_EMAIL": "agent@sandbox",
    "GIT_COMMITTER_NAME": "Agent",
    "GIT_COMMITTER_EMAIL": "agent@sandbox",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "PATH": "/usr/bin:/bin",
}

POLICY = """
[[rules]]
effect = "git.push"
when = { branch = "agent/*" }
action = "auto"
reason = "agent branches are scratch space"

[[rules]]
effect = "github.pull_request.create"
action = "approve"
timeout = "1h"
reason = "a person reads every pull request first"
"""


def agent_git(work: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(work), *args], env=GIT_ENV, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def test_agent_pushes_asks_for_a_pr_and_a_person_approves(hub: Hub, tmp_path: Path) -> None:
    """Stand-ins: the fake serving the bare repo git.push writes to; the agent gets the PR URL."""
    # git.push applies by policy, the PR waits; the card holds the compare diff; after
    # `decide` the agent's result carries the URL, and no result file holds the token
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", str(hub.remote), str(work)], check=True, env=GIT_ENV)
    base = agent_git(work, "rev-parse", "HEAD")
    (work / "src" / "app.py").write_text("x = 42\n")
    agent_git(work, "commit", "-q", "-am", "make x the answer")
    agent_git(work, "bundle", "create", "-q", str(tmp_path / "fix.bundle"), "origin/main..HEAD")
    integrations = {
        "git": {"remotes": {"origin": {"url": str(hub.remote)}}, "protected_branches": ["main"]},
        "github": hub.settings,
    }
    h = BrokerHarness(tmp_path / "broker", integrations=integrations, policy=POLICY)
    with h:
        time.sleep(0.15)  # the watcher starts a moment after `ready`
        h.write("push.fix.bin", (tmp_path / "fix.bundle").read_bytes())
        push = h.submit(
            {
                "version": 1,
                "effect": "git.push",
                "attachments": ["fix"],
                "params": {
                    "remote": "origin",
                    "branch": "agent/fix",
                    "bundle": "fix",
                    "expected_old": None,
                },
            },
            name="push",
            timeout=30,
        )
        assert push["status"] == "applied", push
        request = h.request(
            "github.pull_request.create",
            pr(body="The answer, as discussed with @alice.", base_sha=base),
            reason="the fix for the failing test",
        )
        pending = h.submit(request, terminal=False, timeout=30)
        assert pending["status"] == "pending", pending
        ledger = Ledger(h.config.ledger_path)
        try:
            shown = card(ledger, ledger.find(request["id"]), h.registry)
            assert "-x = 1\n+x = 42" in shown["what"]["body"]
            assert "The answer, as discussed with @ alice." in shown["what"]["body"]
            sha = pending["request_sha256"]
            decide(
                ledger,
                request["id"],
                "approve",
                approver="ops",
                reason="read",
                surface="web",
                sha256=sha,
            )
        finally:
            ledger.close()
            nudge(h.state)
        result = h.wait(request["id"], timeout=30)
    assert result["status"] == "applied", result
    pulls = hub.fake.pulls(REPO)
    assert len(pulls) == 1 and pulls[0]["head"] == "agent/fix"
    assert result["output"]["url"] == f"{hub.fake.url}/acme/api/pull/{pulls[0]['number']}"
    assert result["decided_by"] == "ops"
    for written in h.results.glob("*.json"):
        assert TOKEN not in written.read_text()


# -- Prism: GitHub's OpenAPI description accepts every call ----------------------------------

SHA, SHA2 = "a" * 40, "b" * 40
PRISM_CASES: dict[str, Callable[[Api], object]] = {
    "branch_sha": lambda api: api.branch_sha("agent/fix"),
    "commit": lambda api: api.commit(SHA),
    "tree": lambda api: api.tree(SHA),
    "blob": lambda api: api.blob(SHA),
    "compare": lambda api: api.compare(SHA, SHA2),
    "create_blob": lambda api: api.create_blob(b"\x89PNG bytes"),
    "create_tree": lambda api: api.create_tree(
        SHA,
        [
            {"path": "docs/a.md", "mode": "100644", "type": "blob", "sha": SHA2},
            {"path": "old.txt", "mode": "100644", "type": "blob", "sha": None},
        ],
    ),
    "create_commit": lambda api: api.create_commit("a message", SHA, [SHA2]),
    "create_branch": lambda api: api.create_branch("agent/fix", SHA),
    "delete_branch": lambda api: api.delete_branch("agent/fix"),
    "open_pulls": lambda api: api.open_pulls("agent/fix", "main"),
    "create_pull": lambda api: api.create_pull(
        head="agent/fix", base="main", title="t", body="b", draft=True
    ),
    "pull": lambda api: api.pull(7),
    "close_pull": lambda api: api.close_pull(7),
    "request_reviewers": lambda api: api.request_reviewers(7, ["alice"], ["core"]),
    "issue": lambda api: api.issue(7),
    "create_issue": lambda api: api.create_issue(title="t", body="b", labels=["bug"]),
    "close_issue": lambda api: api.close_issue(7),
    "comment": lambda api: api.comment(7, "a comment"),
    "delete_comment": lambda api: api.delete_comment(42),
    "labels": lambda api: api.labels(7),
    "add_labels": lambda api: api.add_labels(7, ["bug", "needs review"]),
    "remove_label": lambda api: api.remove_label(7, "needs review"),
}


@pytest.fixture(scope="session")
def prism_launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prism | None]:
    """Prism loading in the background (None when not installed); `prism` waits for it."""
    if not installed():
        yield None
        return
    folder = tmp_path_factory.mktemp("prism")
    operations = [*Api.operations().values(), APP_TOKEN_CALL]
    spec = (
        GITHUB_SPEC_FILE
        if os.environ.get("PRISM_FULL_SPEC")
        else subset_spec(GITHUB_SPEC_FILE, operations, folder / "github-subset.json")
    )
    launched = Prism(spec, folder / "prism.log")
    yield launched
    launched.stop()


@pytest.fixture(scope="module", autouse=True)
def prism_early(prism_launch: Prism | None) -> None:
    """Start Prism as this module starts, so its load overlaps the fake's tests."""


@pytest.fixture(scope="session")
def prism(prism_launch: Prism | None) -> Iterator[RecordingProxy]:
    """A recording proxy in front of a ready Prism; skips (fails under CI) without Prism."""
    if prism_launch is None:
        message = (
            "Prism is not installed: run `make prism` (scripts/prism-up.sh) to test the "
            "GitHub calls against GitHub's OpenAPI description"
        )
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {message}")
        pytest.skip(message)
    prism_launch.wait()
    proxy = RecordingProxy(prism_launch.url)
    yield proxy
    proxy.stop()


def prism_ctx(proxy: RecordingProxy, tmp_path: Path, **settings: Any) -> Context:
    table = {"token_env": TOKEN_ENV, "base_url": proxy.url, **settings}
    return make_context(
        table,
        integration="github",
        sandbox="sb",
        request_id="prism",
        request_sha256="c" * 64,
        state_dir=tmp_path,
        secrets={"token": TOKEN},
    )


def accepted(exchanges: list[Any]) -> None:
    assert exchanges, "no request reached Prism"
    for ex in exchanges:
        assert 200 <= ex.status < 300, f"{ex.method} {ex.path} → {ex.status}"
        request_errors = [e for e in ex.errors if e.startswith("request")]
        assert request_errors == [], f"{ex.method} {ex.path}: {request_errors}"


def test_the_fake_serves_exactly_the_handlers_operations() -> None:
    """Stand-in: none. The fake routes exactly the REST calls Api names, by the same paths."""
    routes = {(method, route) for method, route, _, _ in FakeGitHub()._routes}
    assert routes == {*Api.operations().values(), APP_TOKEN_CALL}
    assert set(PRISM_CASES) == set(Api.operations())


@pytest.mark.parametrize("name", sorted(PRISM_CASES))
def test_prism_accepts_each_call(
    name: str, prism: RecordingProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-in: Prism (GitHub's description validates method, path, query and body)."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    prism.take()
    PRISM_CASES[name](Api(gh.client(prism_ctx(prism, tmp_path)), REPO))
    exchanges = prism.take()
    accepted(exchanges)
    verb, template = Api.operations()[name]
    path = re.sub(r"\{[a-z_]+\}", "[^/]+", template.replace("{owner}/{repo}", REPO))
    assert [(e.method, bool(re.fullmatch(path, e.path))) for e in exchanges] == [(verb, True)]


def test_prism_accepts_every_handlers_calls(
    prism: RecordingProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-in: Prism. Each handler's preview, apply and undo send only valid requests."""
    # Prism answers with the description's examples, so the flows follow them (an open
    # pull request exists already, say); what is checked is that every request is valid
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    ctx = prism_ctx(prism, tmp_path)
    prism.take()
    flows: list[tuple[Any, dict[str, Any]]] = [
        (PullRequestCreate(), pr(labels=["bug"], reviewers=["alice"])),
        (PullRequestCreate(), pr(files=FILES, base_sha=SHA)),
        (IssueCreate(), {"repo": REPO, "title": "t", "body": "@bob", "labels": ["bug"]}),
        (IssueComment(), {"repo": REPO, "number": 7, "body": "b"}),
        (PullRequestComment(), {"repo": REPO, "number": 7, "body": "b"}),
        (LabelAdd(), {"repo": REPO, "number": 7, "labels": ["triage"]}),
    ]
    for handler, params in flows:
        handler.check(params, ctx)
        handler.preview(params, ctx)
        out = handler.apply(params, ctx)
        if out.get("created", True):
            handler.revert(out, ctx)
    accepted(prism.take())


def test_prism_accepts_the_github_app_token_exchange(prism: RecordingProxy, tmp_path: Path) -> None:
    """Stand-in: Prism. The App's installation-token request matches GitHub's description."""
    key_file, _ = app_key(tmp_path)
    settings = {"app_id": 4242, "private_key_file": str(key_file), "installation_id": 77}
    ctx = dataclasses.replace(
        prism_ctx(prism, tmp_path),
        settings={"base_url": prism.url, **settings},
        secret=lambda key: key_file.read_text() if key == "private_key" else None,
    )
    prism.take()
    IssueCreate().apply({"repo": REPO, "title": "t"}, ctx)
    exchanges = prism.take()
    accepted(exchanges)
    assert exchanges[0].method == "POST"
    assert exchanges[0].path == "/app/installations/77/access_tokens"
    assert json.dumps([e.path for e in exchanges]).count("/repos/acme/api/issues") == 1
