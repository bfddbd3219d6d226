"""A pull request's live state on GitHub: the base and head commits and, for `files`,
each path's entry on the base. The preview shows it and remembers it (`ctx.remember`,
kept by the broker with the request); apply reads it again and refuses what moved
since the approver saw it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker.errors import EffectFailed
from broker.typing import Params
from effects.github.api import Api, Entry
from effects.github.changes import Change


@dataclass(frozen=True)
class Live:
    """A pull request's live state: what is shown, and re-checked before applying."""

    base_sha: str
    head_sha: str | None
    base_tree: str | None = None
    entries: Mapping[str, Entry | None] | None = None  # files mode: each path on base

    def blobs(self) -> dict[str, str | None]:
        return {p: (e.sha if e else None) for p, e in (self.entries or {}).items()}

    def seen(self) -> dict[str, Any]:
        """What the approver is shown, for apply to re-check (`ctx.remember`)."""
        return {"base": self.base_sha, "head": self.head_sha, "blobs": self.blobs()}


def read_live(api: Api, params: Params, changed: Sequence[Change]) -> Live:
    """The base (and head) as they are now; with `files`, each path's entry on base."""
    base = params["base"]
    base_sha = api.branch_sha(base)
    if base_sha is None:
        raise EffectFailed(f"failed: {api.repo} has no branch {base} to open a PR into")
    head_sha = api.branch_sha(params["head"])
    if not changed:
        if head_sha is None:
            raise EffectFailed(
                f"failed: {api.repo} has no branch {params['head']}; push it with "
                "git.push first, or give `files` for the host to commit"
            )
        return Live(base_sha, head_sha)
    tree = api.commit(base_sha).tree
    return Live(base_sha, head_sha, tree, entries_at(api, tree, [c.path for c in changed]))


def entries_at(api: Api, tree: str, paths: Sequence[str]) -> dict[str, Entry | None]:
    """Each path's entry in `tree`, walking one level per directory (never truncated)."""
    cache: dict[str, dict[str, Entry]] = {"": api.tree(tree)}
    out: dict[str, Entry | None] = {}
    for path in paths:
        parts = path.split("/")
        entry: Entry | None = None
        prefix = ""
        for i, part in enumerate(parts):
            listing = cache.get(prefix)
            if listing is None:
                out[path] = None
                break
            entry = listing.get(part)
            if entry is None:
                out[path] = None
                break
            if i < len(parts) - 1:
                if entry.type != "tree":
                    raise EffectFailed(
                        f"failed: {'/'.join(parts[: i + 1])} is a file in {api.repo}, so "
                        f"{path} cannot be written below it"
                    )
                prefix = "/".join(parts[: i + 1])
                if prefix not in cache:
                    cache[prefix] = api.tree(entry.sha)
        else:
            out[path] = entry
    return out


def conflicts(api: Api, params: Params, live: Live, changed: Sequence[Change]) -> list[str]:
    """`files` that cannot be applied: unwritable, or changed since the agent's base_sha."""
    entries = live.entries or {}
    found = [
        why for c in changed if (why := _unwritable(c.path, entries.get(c.path), c)) is not None
    ]
    agent = params.get("base_sha")
    if changed and agent and agent != live.base_sha:
        from github.GithubException import UnknownObjectException

        try:
            then = entries_at(api, api.commit(agent).tree, [c.path for c in changed])
        except UnknownObjectException:
            return [*found, f"base_sha {agent[:12]} is not a commit in {api.repo}"]
        for c in changed:
            was, now = then.get(c.path), entries.get(c.path)
            if (was.sha if was else None) != (now.sha if now else None):
                found.append(
                    f"{c.path} changed on {params['base']} since base_sha {agent[:12]}; "
                    "read it again and send the new content"
                )
    return found


def _unwritable(path: str, entry: Entry | None, change: Change) -> str | None:
    """Why this change cannot be made on top of `entry`, or None."""
    if entry is None:
        return f"{path} does not exist on the base" if change.data is None else None
    if entry.type == "tree":
        return f"{path} is a directory on the base"
    if entry.mode == "120000":
        return f"{path} is a symbolic link on the base"
    if entry.type != "blob":
        return f"{path} is a submodule on the base"
    return None


def recheck(
    api: Api, params: Params, live: Live, seen: Mapping[str, Any] | None, files: bool
) -> None:
    """Refuse to apply when the base, the head (a pushed branch) or a file's blob (files)
    moved since the approver saw it; without a preview, the agent's base_sha must hold."""
    base, head = params["base"], params["head"]
    who = "the approver saw it" if seen else "the agent's base_sha"
    expected = seen.get("base") if seen else params.get("base_sha")
    if expected and expected != live.base_sha:
        raise EffectFailed(
            f"failed: {base} in {api.repo} moved since {who} ({str(expected)[:12]} → "
            f"{live.base_sha[:12]}); nothing was done: send the request again"
            + (" with base_sha " + live.base_sha if params.get("base_sha") else "")
        )
    if seen is None:
        return
    if files and seen.get("blobs") != live.blobs():
        moved = [p for p, s in live.blobs().items() if (seen.get("blobs") or {}).get(p) != s]
        raise EffectFailed(
            f"failed: {', '.join(moved[:5]) or 'the files'} changed on {base} since "
            "the approver saw it; nothing was done: send the request again"
        )
    if not files and seen.get("head") != live.head_sha:
        raise EffectFailed(
            f"failed: {head} in {api.repo} moved since the approver saw it "
            f"({str(seen.get('head'))[:12]} → {str(live.head_sha)[:12]}); nothing was "
            "done: send the request again"
        )
