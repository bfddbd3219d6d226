"""Staging a waiting git.push for review: the bundle's commit pushed to a broker-owned
branch (never the request's branch, its base or a protected branch), so a person can
review it as a draft pull request before anything reaches the branch the agent asked
for (broker.integrations.github_staging). The same cache, verification and lease as
the push itself (effects.git); the branch must not exist yet, or be at that commit
already (a retry after a crash).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.errors import EffectFailed, InvalidParams
from broker.typing import Params
from effects.base import Context
from effects.git import GitPush
from effects.gitrun import Git, _lock

__all__ = ["Staged", "stage_push"]


@dataclass(frozen=True)
class Staged:
    """What staging pushed: the commit, on which branch, compared with which base."""

    remote: str
    url: str
    branch: str
    commit: str
    base: str  # the branch the draft pull request is opened against


def stage_push(handler: GitPush, params: Params, ctx: Context, branch: str) -> Staged:
    """Push the request's bundle commit to `branch`; raises EffectFailed when it may not."""
    if branch in (params["branch"], params.get("base")):
        raise EffectFailed(f"failed: the staging branch {branch} is the request's own branch")
    try:
        handler.check({**params, "branch": branch}, ctx)  # protected_branches, the remote
    except InvalidParams as exc:
        raise EffectFailed(f"failed: {branch} may not be a staging branch: {exc}") from exc
    remote = handler._remote(params, ctx)
    with _lock(remote.name):
        prepared = handler._prepare(params, ctx)
        current = handler._rev(Git(prepared.cache), f"refs/remotes/origin/{branch}")
        if current is not None and current != prepared.new:
            raise EffectFailed(
                f"failed: the staging branch {branch} exists at another commit "
                f"({current[:12]}); nothing was staged"
            )
        if current is None:
            handler._push(prepared.cache, remote, prepared.new, branch, None)
    base = params.get("base") or remote.default_branch
    return Staged(remote.name, remote.url, branch, prepared.new, str(base))
