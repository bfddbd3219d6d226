"""What the approver saw: the preview remembers it (`ctx.remember`), the broker keeps it
with the request, and apply re-checks it. Without it, apply holds only the agent's
base_sha, as the handler documents."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker.approval.decisions import Ballot, decide, nudge
from broker.context import Memo
from broker.errors import EffectFailed
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, make_context
from effects.base import Context
from effects.github import PullRequestCreate
from tests.effects.github.fake import commit_on
from tests.effects.github.support import FILES, REPO, Hub, pr

POLICY = """
[[rules]]
effect = "github.pull_request.create"
action = "approve"
timeout = "1h"
reason = "a person reads every pull request first"
"""


def ctx_with(hub: Hub, memo: Memo, request_id: str = "r1") -> Context:
    """A fresh Context for one call, sharing `memo` as the broker shares a request's."""
    return make_context(
        hub.settings, integration="github", request_id=request_id, state_dir=hub.state, memo=memo
    )


class TestWhatThePreviewRemembers:
    def test_a_pushed_branch_remembers_base_and_head(self, hub: Hub) -> None:
        """Stand-in: the fake. The preview keeps the two commits it diffed, nothing else."""
        head = hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        memo = Memo()
        PullRequestCreate().preview(pr(), ctx_with(hub, memo))
        assert memo.recall() == {"base": hub.sha("main"), "head": head, "blobs": {}}
        assert not (hub.state / "github").exists()

    def test_files_remember_each_blob_on_the_base(self, hub: Hub) -> None:
        """Stand-in: the fake. Each path's blob on base (None: a new file) is kept."""
        memo = Memo()
        PullRequestCreate().preview(pr(head="agent/docs", files=FILES), ctx_with(hub, memo))
        seen = memo.recall()
        assert seen is not None
        assert seen["base"] == hub.sha("main") and seen["head"] is None
        assert seen["blobs"]["docs/new/page.md"] is None
        assert len(str(seen["blobs"]["README.md"])) == 40


class TestApplyRechecksWhatWasSeen:
    def test_shared_memo_refuses_a_head_that_moved(self, hub: Hub) -> None:
        """Stand-in: the fake. Preview and apply in separate contexts sharing one memo:
        the agent pushes again after the preview, and nothing is opened."""
        hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        memo = Memo()
        PullRequestCreate().preview(pr(), ctx_with(hub, memo))
        hub.push("agent/fix", {"src/app.py": "x = 3\n"})
        with pytest.raises(EffectFailed, match="agent/fix in acme/api moved since the approver"):
            PullRequestCreate().apply(pr(), ctx_with(hub, memo))
        assert hub.fake.pulls(REPO) == []

    def test_without_the_memo_the_moved_head_is_opened(self, hub: Hub) -> None:
        """Stand-in: the fake. An apply with nothing remembered (an auto-applied request)
        has no head to hold: it opens the pull request on the branch as it is now."""
        hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        PullRequestCreate().preview(pr(), ctx_with(hub, Memo()))
        now = hub.push("agent/fix", {"src/app.py": "x = 3\n"})
        out = PullRequestCreate().apply(pr(), ctx_with(hub, Memo()))
        assert out["created"] is True and out["head_sha"] == now

    def test_without_the_memo_the_agents_base_sha_still_holds(self, hub: Hub) -> None:
        """Stand-in: the fake. Nothing remembered: a stale base_sha fails, naming it."""
        old = str(hub.sha("main"))
        hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        commit_on(hub.remote, "main", {"README.md": b"moved\n"}, "someone else")
        with pytest.raises(EffectFailed, match="moved since the agent's base_sha"):
            PullRequestCreate().apply(pr(base_sha=old), ctx_with(hub, Memo()))
        assert hub.fake.pulls(REPO) == []

    def test_shared_memo_refuses_files_onto_a_base_that_moved(self, hub: Hub) -> None:
        """Stand-in: the fake. With files, a base that moved since the preview fails the
        apply; with nothing remembered (and no base_sha), the host commits on it as it is."""
        memo = Memo()
        params = pr(head="agent/docs", files=FILES)
        PullRequestCreate().preview(params, ctx_with(hub, memo))
        commit_on(hub.remote, "main", {"README.md": b"other\n"}, "someone else")
        with pytest.raises(EffectFailed, match="main in acme/api moved since the approver saw it"):
            PullRequestCreate().apply(params, ctx_with(hub, memo))
        assert hub.sha("agent/docs") is None
        out = PullRequestCreate().apply(params, ctx_with(hub, Memo(), "r2"))
        assert out["created"] is True and hub.show("agent/docs", "README.md") == "hello, world\n"


def test_the_broker_keeps_what_was_seen_until_the_request_ends(hub: Hub, tmp_path: Path) -> None:
    """Stand-in: the fake, behind a real broker. The pending request holds what its
    preview saw; approved after the head moved, it fails; then nothing is kept."""
    first = hub.push("agent/fix", {"src/app.py": "x = 2\n"})
    h = BrokerHarness(tmp_path / "broker", integrations={"github": hub.settings}, policy=POLICY)
    with h:
        time.sleep(0.15)  # the watcher starts a moment after `ready`
        request = h.request("github.pull_request.create", pr())
        pending = h.submit(request, terminal=False, timeout=30)
        assert pending["status"] == "pending", pending
        ledger = Ledger(h.config.ledger_path)
        try:
            record = ledger.find(request["id"])
            assert record is not None and record.seen is not None
            assert (record.seen["base"], record.seen["head"]) == (hub.sha("main"), first)
            hub.push("agent/fix", {"src/app.py": "x = 3\n"})
            sha = pending["request_sha256"]
            decide(
                ledger,
                Ballot(
                    request["id"],
                    "approve",
                    approver="ops",
                    reason="read",
                    surface="web",
                    sha256=sha,
                ),
            )
        finally:
            ledger.close()
            nudge(h.state)
        result = h.wait(request["id"], timeout=30)
        ledger = Ledger(h.config.ledger_path)
        try:
            ended = ledger.find(request["id"])
        finally:
            ledger.close()
    assert result["status"] == "failed", result
    assert "agent/fix in acme/api moved since the approver saw it" in result["reason"]
    assert hub.fake.pulls(REPO) == []
    assert ended is not None and ended.seen is None
    assert not (h.state / "github").exists()
