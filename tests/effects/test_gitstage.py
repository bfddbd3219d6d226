"""Staging a git.push for review (effects.gitstage) against a real bare repository: the
bundle's commit on a broker-owned branch, never the agent's own or a protected one."""

from __future__ import annotations

import pytest

from broker.errors import EffectFailed
from effects.git import GitPush
from effects.gitstage import stage_push
from tests.effects.test_git import World, git, params, world

__all__ = ["world"]  # the fixture, shared with test_git.py


def test_staging_pushes_the_commit_to_the_staging_branch_only(world: World) -> None:
    """The remote gets broker/pending/r1 at the bundle's commit; agent/fix stays absent;
    staging again (a retry after a crash) changes nothing."""
    new = world.commit("src/x.py", "x = 1\n", "add x")
    ctx = world.ctx(world.bundle())
    staged = stage_push(GitPush(), params(), ctx, "broker/pending/r1")
    assert staged.commit == new and staged.base == "main"
    assert world.head("broker/pending/r1") == new and world.head("agent/fix") is None
    assert stage_push(GitPush(), params(), ctx, "broker/pending/r1") == staged


@pytest.mark.parametrize(
    ("branch", "why"),
    [("agent/fix", "own branch"), ("main", "own branch"), ("release/r1", "protected")],
)
def test_staging_refuses_the_requests_own_or_a_protected_branch(
    world: World, branch: str, why: str
) -> None:
    """The request's branch, its base and a protected glob are never staging branches."""
    world.commit("src/x.py", "x = 1\n", "add x")
    with pytest.raises(EffectFailed, match=why):
        stage_push(GitPush(), params(base="main"), world.ctx(world.bundle()), branch)
    assert world.head(branch) is None or branch == "main"


def test_staging_refuses_a_branch_someone_else_moved(world: World) -> None:
    """A staging branch already at another commit is left alone and the staging fails."""
    world.commit("src/x.py", "x = 1\n", "add x")
    git(world.work, "push", "-q", "origin", "HEAD:refs/heads/broker/pending/r1")
    other = world.commit("src/y.py", "y = 1\n", "add y")
    with pytest.raises(EffectFailed, match="exists at another commit"):
        stage_push(GitPush(), params(), world.ctx(world.bundle()), "broker/pending/r1")
    assert world.head("broker/pending/r1") != other
