"""git.push against a real bare repository on local disk as the remote."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.errors import EffectFailed, InvalidParams
from broker.testing import BrokerHarness, make_context
from effects.base import Context
from effects.git import GitPush

ENV = {
    "GIT_AUTHOR_NAME": "Agent",
    "GIT_AUTHOR_EMAIL": "agent@sandbox",
    "GIT_COMMITTER_NAME": "Agent",
    "GIT_COMMITTER_EMAIL": "agent@sandbox",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "PATH": "/usr/bin:/bin",
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], env=ENV, check=True, capture_output=True, text=True
    ).stdout.strip()


@dataclass
class World:
    """A bare remote with a main branch, and an agent's clone of it."""

    remote: Path
    work: Path
    state: Path
    settings: dict[str, Any]

    def commit(self, path: str, text: str, message: str) -> str:
        target = self.work / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        git(self.work, "add", path)
        git(self.work, "commit", "-q", "-m", message)
        return git(self.work, "rev-parse", "HEAD")

    def bundle(self, spec: str = "origin/main..HEAD") -> Path:
        out = self.state / f"b{len(list(self.state.glob('b*')))}.bundle"
        git(self.work, "bundle", "create", "-q", str(out), spec)
        return out

    def head(self, branch: str) -> str | None:
        done = subprocess.run(
            ["git", "-C", str(self.remote), "rev-parse", "--verify", "--quiet", branch],
            capture_output=True,
            text=True,
        )
        return done.stdout.strip() or None

    def ctx(self, bundle: Path, sha: str = "a" * 64) -> Context:
        return make_context(
            self.settings,
            integration="git",
            sandbox="sb",
            request_id="r1",
            request_sha256=sha,
            state_dir=self.state,
            attachments={"fix": bundle},
        )


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """A bare remote with one commit on main, cloned into a work tree."""
    remote, work, state = tmp_path / "remote.git", tmp_path / "work", tmp_path / "state"
    state.mkdir()
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    w = World(
        remote,
        work,
        state,
        {
            "remotes": {"origin": {"url": str(remote)}},
            "protected_branches": ["main", "release/*"],
            "protected_paths": [".github/workflows/*", "policy.toml"],
        },
    )
    w.commit("README.md", "hello\n", "initial")
    git(work, "remote", "add", "origin", str(remote))
    git(work, "push", "-q", "origin", "main")
    git(work, "fetch", "-q", "origin")
    yield w


def params(branch: str = "agent/fix", expected_old: str | None = None, **kw: Any) -> dict[str, Any]:
    return {
        "remote": "origin",
        "branch": branch,
        "bundle": "fix",
        "expected_old": expected_old,
        **kw,
    }


def test_push_creates_a_branch_with_the_agents_commit(world: World) -> None:
    """A bundle of one commit becomes a new branch on the remote, with that commit."""
    new = world.commit("src/app.py", "print('fixed')\n", "fix the bug")
    handler = GitPush()
    ctx = world.ctx(world.bundle())
    out = handler.apply(params(), ctx)
    assert out["pushed"] is True and out["new"] == new and out["commits"] == 1
    assert world.head("agent/fix") == new


def test_preview_shows_the_exact_diff_messages_and_authors(world: World) -> None:
    """The reviewer sees the patch line, the commit message and its author."""
    world.commit("src/app.py", "print('fixed')\n", "fix the bug")
    preview = GitPush().preview(params(), world.ctx(world.bundle()))
    assert "+print('fixed')" in preview.body
    assert "fix the bug" in preview.body and "Agent <agent@sandbox>" in preview.body
    assert "src/app.py" in preview.body
    assert dict(preview.facts)["branch"] == "agent/fix (new)"


def test_retry_of_an_applied_push_is_a_no_op(world: World) -> None:
    """Applying the same push twice (a restart mid-apply) succeeds without a second push."""
    world.commit("a.txt", "a\n", "a")
    ctx = world.ctx(world.bundle())
    handler = GitPush()
    assert handler.apply(params(), ctx)["pushed"] is True
    assert handler.apply(params(), ctx)["pushed"] is False


def test_lease_refuses_to_overwrite_a_branch_that_moved(world: World) -> None:
    """An update whose expected_old is stale fails with a reason; the remote is untouched."""
    first = world.commit("a.txt", "1\n", "one")
    handler = GitPush()
    handler.apply(params(), world.ctx(world.bundle()))
    # someone else pushes to the branch meanwhile
    other = world.commit("b.txt", "other\n", "someone else")
    git(world.work, "push", "-q", "origin", "HEAD:agent/fix")
    git(world.work, "reset", "-q", "--hard", first)
    world.commit("c.txt", "mine\n", "mine")
    with pytest.raises(EffectFailed, match="moved since the request"):
        handler.apply(params(expected_old=first), world.ctx(world.bundle(f"{first}..HEAD")))
    assert world.head("agent/fix") == other


def test_new_branch_refused_when_it_already_exists(world: World) -> None:
    """expected_old null means "must not exist": an existing branch is not overwritten."""
    world.commit("a.txt", "1\n", "one")
    git(world.work, "push", "-q", "origin", "HEAD:agent/fix")
    before = world.head("agent/fix")
    world.commit("b.txt", "2\n", "two")
    with pytest.raises(EffectFailed, match="moved since the request"):
        GitPush().apply(params(), world.ctx(world.bundle()))
    assert world.head("agent/fix") == before


def test_protected_branch_is_refused_at_check(world: World) -> None:
    """Pushing to main or release/* is invalid before anyone is asked."""
    handler = GitPush()
    for branch in ("main", "release/1.2"):
        with pytest.raises(InvalidParams, match="protected branch"):
            handler.check(params(branch=branch), world.ctx(world.bundle("main")))


def test_protected_path_needs_acknowledgement_and_assessment(world: World) -> None:
    """A change to .github/workflows/ is refused without touch_protected (when assessed and
    at apply); acknowledged, the assessment reports the protected path (so the policy makes
    a person approve), and apply pushes only a change whose protected paths were assessed."""
    world.commit(".github/workflows/ci.yml", "on: push\n", "ci")
    ctx = world.ctx(world.bundle())
    with pytest.raises(InvalidParams, match="protected paths"):
        GitPush().protected_for(params(), ctx)
    with pytest.raises(InvalidParams, match="protected paths"):
        GitPush().apply(params(), ctx)
    assert world.head("agent/fix") is None
    preview = GitPush().preview(params(), ctx)
    assert dict(preview.facts)["PROTECTED PATHS"] == ".github/workflows/ci.yml"
    with pytest.raises(EffectFailed, match="assessment did not see"):
        GitPush().apply(params(touch_protected=True), ctx)
    assert world.head("agent/fix") is None
    acknowledged = params(touch_protected=True)
    assert GitPush().protected_for(acknowledged, ctx) == [".github/workflows/ci.yml"]
    assert GitPush().apply(acknowledged, ctx)["pushed"] is True


def test_corrupt_bundle_is_refused(world: World, tmp_path: Path) -> None:
    """Bytes that are not a bundle fail with a clear reason."""
    junk = tmp_path / "junk.bundle"
    junk.write_bytes(b"# v2 git bundle\n" + b"\x00garbage" * 100)
    with pytest.raises(EffectFailed, match=r"not a valid git bundle|carries no refs"):
        GitPush().apply(params(), world.ctx(junk))


def test_bundle_with_refs_to_several_commits_is_refused(world: World) -> None:
    """A bundle smuggling a second ref (to another commit) is refused."""
    world.commit("a.txt", "a\n", "a")
    git(world.work, "branch", "extra")
    world.commit("b.txt", "b\n", "b")
    bundle = world.state / "two.bundle"
    git(
        world.work, "bundle", "create", "-q", str(bundle), "origin/main..main", "origin/main..extra"
    )
    with pytest.raises(EffectFailed, match="several commits"):
        GitPush().apply(params(), world.ctx(bundle))
    assert world.head("agent/fix") is None


def test_bundle_needing_commits_the_remote_lacks_is_refused(world: World) -> None:
    """A thin bundle based on an unpushed commit says how to make a good one."""
    base = world.commit("a.txt", "a\n", "unpushed")
    world.commit("b.txt", "b\n", "on top")
    with pytest.raises(EffectFailed, match="commits the remote does not have"):
        GitPush().apply(params(), world.ctx(world.bundle(f"{base}..HEAD")))


def test_unknown_remote_is_invalid(world: World) -> None:
    """A remote not named in the host config is refused at check."""
    with pytest.raises(InvalidParams, match="no remote named 'elsewhere'"):
        GitPush().check(params(remote="elsewhere"), world.ctx(world.bundle("main")))


def test_revert_deletes_a_created_branch(world: World) -> None:
    """Undo of a push that created a branch deletes it (only if it did not move)."""
    world.commit("a.txt", "a\n", "a")
    ctx = world.ctx(world.bundle())
    handler = GitPush()
    out = handler.apply(params(), ctx)
    handler.revert(out, ctx)
    assert world.head("agent/fix") is None


def test_end_to_end_through_the_broker(world: World, tmp_path: Path) -> None:
    """An agent's bundle attachment + git.push request: gated by default, auto by policy."""
    new = world.commit("src/x.py", "x = 1\n", "add x")
    bundle = world.bundle()
    policy = (
        '[[rules]]\neffect = "git.push"\nwhen = { branch = "agent/*" }\naction = "auto"\n'
        'reason = "agent branches are scratch space"\n'
    )
    h = BrokerHarness(tmp_path / "h", integrations={"git": world.settings}, policy=policy)
    with h:
        h.write("push1.fix.bin", bundle.read_bytes())
        result = h.submit(
            {"version": 1, "effect": "git.push", "params": params(), "attachments": ["fix"]},
            name="push1",
            timeout=30,
        )
        assert result["status"] == "applied", result
        assert result["output"]["new"] == new
        h.write("push2.fix.bin", bundle.read_bytes())
        gated = h.submit(
            {
                "version": 1,
                "effect": "git.push",
                "attachments": ["fix"],
                "params": params(branch="feature/y"),
            },
            name="push2",
            timeout=30,
            terminal=False,
        )
        assert gated["status"] == "pending"
    assert world.head("agent/fix") == new
    assert world.head("feature/y") is None
