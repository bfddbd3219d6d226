"""git.push: commits leave the sandbox as a git bundle and are pushed with host credentials.

Settings, `[integrations.git]`:

    cache_dir = "/var/lib/broker/git-cache"        # default: <state>/git-cache
    protected_branches = ["main", "release/*"]     # never pushed to by an agent
    protected_paths = ["deploy/*"]                 # older key: see [repositories.NAME]
    [integrations.git.remotes.origin]
    url = "https://github.com/acme/api.git"        # or a path, for a local remote
    token_env = "GITHUB_TOKEN"                     # optional, for https: standing
    username = "x-access-token"                    # default
    default_branch = "main"                        # what a new branch is compared with
    repository = "acme/api"                        # for a minted token; default: the URL's

With `credential = "NAME"` in `[integrations.git]` (a `kind = "github_app"` provider,
docs/credentials.md), an https remote holds no token: each call gets an installation
token for the remote's repository alone, `contents: write` to push (and to undo),
`contents: read` to fetch for an assessment or a preview, revoked when the call ends
(effects/gitcreds.py).

The host verifies the bundle against a cache of the remote, shows the exact diff,
refuses protected branches, and pushes with `--force-with-lease`, so a branch that
moved since the request is never overwritten. A change touching a protected path of
the remote's repository (`[repositories.NAME]`, broker/repositories.py; by default
`.github/workflows/**` and `.github/actions/**`)
(added, edited, deleted or renamed away, whatever its characters) waits for a person
whatever the policy's rules say, unless the matching rule names those paths; the
request must say `touch_protected: true` to acknowledge it, and a push whose change
touches protected paths its assessment did not see fails.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from broker.errors import ConfigError, EffectFailed, InvalidParams
from broker.models import Preview
from broker.settings import only_keys
from broker.typing import JSON, Params
from effects import gitcreds
from effects.base import Context, Handler
from effects.gitrun import _EMPTY_TREE, Git, Remote, _diff_span, _lock
from effects.normal_forms import branch_name

MAX_PATCH = 1 << 20


@dataclass(frozen=True)
class Prepared:
    """The push as the host computed it from live state."""

    remote: Remote
    cache: Path
    new: str  # the commit to push
    current: str | None  # the branch's commit on the remote now (None: absent)
    base: str  # what the diff is shown against
    changed: tuple[str, ...]


class GitPush(Handler):
    """Push the commits of a bundle to a branch of a configured remote."""

    name = "git.push"
    identifying = ("remote", "branch", "base")
    reversible = False
    idempotent = True
    undo = (
        "`broker undo` deletes a branch it created or pushes an updated branch back to "
        "its old commit; CI runs and notifications the push triggered stay"
    )
    config_keys = frozenset(
        {"remotes", "cache_dir", "protected_branches", "protected_paths", "credential"}
    )

    def check_config(self, settings: Mapping[str, Any]) -> None:
        super().check_config(settings)
        remotes = settings.get("remotes", {})
        if not isinstance(remotes, Mapping):
            raise ConfigError(
                "integrations.git.remotes: must be tables [integrations.git.remotes.NAME]"
            )
        for name, table in remotes.items():
            where = f"integrations.git.remotes.{name}"
            if not isinstance(table, Mapping) or not isinstance(table.get("url"), str):
                raise ConfigError(f"{where}.url: required, the remote's URL or path")
            only_keys(where, table, gitcreds.REMOTE_KEYS)
            gitcreds.check_remote(settings, table, where)
        for key in ("protected_branches", "protected_paths"):
            value = settings.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"integrations.git.{key}: must be a list of globs")

    # -- request checks ------------------------------------------------------------

    def canonical(self, params: Params, ctx: Context) -> Params:
        branch_name(params["branch"], "/params/branch")
        if params.get("base"):
            branch_name(params["base"], "/params/base")
        return params

    def check(self, params: Params, ctx: Context) -> None:
        self._remote(params, ctx)
        branch = branch_name(params["branch"], "/params/branch")
        for glob in ctx.settings.get("protected_branches", []):
            if fnmatchcase(branch, glob):
                raise InvalidParams(
                    "/params/branch",
                    f"{branch} is a protected branch on this host ({glob}); push to a new "
                    "branch and open a pull request instead",
                    "protected_branch",
                )

    def _remote(self, params: Params, ctx: Context, access: gitcreds.Access = None) -> Remote:
        """The remote the request names, with the token of this call: minted for
        `access` (read, write) when the integration names a provider, else standing."""
        remotes = ctx.settings.get("remotes", {})
        name = params["remote"]
        table = remotes.get(name)
        if table is None:
            known = ", ".join(sorted(remotes)) or "none"
            raise InvalidParams("/params/remote", f"no remote named {name!r} (known: {known})")
        return Remote(
            name=name,
            url=table["url"],
            token=gitcreds.token(ctx, name, table, access),
            username=table.get("username", "x-access-token"),
            default_branch=table.get("default_branch", "main"),
        )

    # -- live state ----------------------------------------------------------------

    def _cache(self, remote: Remote, ctx: Context) -> Path:
        root = Path(ctx.settings.get("cache_dir") or ctx.state_dir / "git-cache")
        repo = root / f"{remote.name}.git"
        if (repo / "HEAD").exists():
            return repo
        # made aside and renamed into place: two first pushes at once (threads, or
        # processes) never run `git init` in one directory
        root.mkdir(parents=True, exist_ok=True)
        aside = Path(tempfile.mkdtemp(prefix=f".{remote.name}.", suffix=".init", dir=root))
        try:
            Git(aside)("init", "--bare", "--quiet")
            try:
                os.rename(aside, repo)  # replaces an empty dir a crash may have left
            except OSError:
                if not (repo / "HEAD").exists():
                    raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)
        return repo

    def _prepare(self, params: Params, ctx: Context, access: gitcreds.Access = "read") -> Prepared:
        remote = self._remote(params, ctx, access)
        cache = self._cache(remote, ctx)
        git = Git(cache, remote)
        git(
            "fetch",
            "--quiet",
            "--prune",
            "--no-tags",
            remote.url,
            "+refs/heads/*:refs/remotes/origin/*",
        )
        bundle = str(ctx.attachment(params["bundle"]))
        verified = git("bundle", "verify", bundle, check=False)
        if verified.returncode != 0:
            lacking = "prerequisite" in verified.stderr or "lacks" in verified.stderr
            raise EffectFailed(
                "failed: the bundle needs commits the remote does not have; create it with "
                "`git bundle create FILE <remote-branch>..HEAD`"
                if lacking
                else "failed: the attachment is not a valid git bundle"
            )
        heads = self._heads(git, bundle)
        new = self._choose(heads, params.get("ref"))
        git(
            "fetch",
            "--quiet",
            "--no-tags",
            bundle,
            f"+{new[1]}:refs/broker/incoming/{ctx.request_sha256[:16] or 'x'}",
        )
        branch = params["branch"]
        current = self._rev(git, f"refs/remotes/origin/{branch}")
        base_name = params.get("base") or remote.default_branch
        if params["expected_old"]:
            if self._rev(git, params["expected_old"] + "^{commit}") is None:
                raise EffectFailed(
                    f"failed: expected_old {params['expected_old'][:12]} is not on remote "
                    f"{remote.name}; fetch it again and rebase"
                )
            base = params["expected_old"]
        else:
            found = self._rev(git, f"refs/remotes/origin/{base_name}")
            base = found or _EMPTY_TREE
        # -z: paths as they are (never C-quoted); --no-renames: a rename shows both ends
        names = git("diff", "--name-only", "-z", "--no-renames", *_diff_span(base, new[0]))
        changed = tuple(p for p in names.stdout.split("\0") if p)
        return Prepared(remote, cache, new[0], current, base, changed)

    @staticmethod
    def _heads(git: Git, bundle: str) -> list[tuple[str, str]]:
        listed = git("bundle", "list-heads", bundle).stdout.strip().splitlines()
        heads = []
        for line in listed:
            sha, _, ref = line.partition(" ")
            heads.append((sha.strip(), ref.strip()))
        if not heads:
            raise EffectFailed("failed: the bundle carries no refs; bundle a branch or HEAD")
        return heads

    @staticmethod
    def _choose(heads: Sequence[tuple[str, str]], wanted: str | None) -> tuple[str, str]:
        if wanted:
            chosen = [h for h in heads if h[1] in (wanted, f"refs/heads/{wanted}")]
            if not chosen:
                raise EffectFailed(f"failed: the bundle has no ref {wanted!r}")
        else:
            chosen = list(heads)
        if len({sha for sha, _ in heads}) > 1:
            raise EffectFailed(
                "failed: the bundle carries refs to several commits; bundle only the one "
                "branch to push"
            )
        return chosen[0]

    @staticmethod
    def _rev(git: Git, name: str) -> str | None:
        done = git("rev-parse", "--verify", "--quiet", name, check=False)
        return done.stdout.strip() or None if done.returncode == 0 else None

    def _protected(self, prepared: Prepared, params: Params, ctx: Context) -> list[str]:
        globs = ctx.repositories.for_remote(params["remote"])
        return [p for p in prepared.changed if any(fnmatchcase(p, g) for g in globs)]

    def protected_for(self, params: Params, ctx: Context) -> Sequence[str]:
        """The protected paths the bundle's change touches, computed on live state (off
        the loop); the request must acknowledge them with touch_protected."""
        touched = self._protected(self._prepare(params, ctx), params, ctx)
        if touched and not params.get("touch_protected"):
            raise InvalidParams(
                "/params/touch_protected",
                f"the change touches protected paths ({', '.join(touched[:5])}); set "
                "touch_protected: true if intended (a person must approve it)",
                "protected_path",
            )
        ctx.remember({"protected": touched})
        return touched

    # -- preview, apply, revert ----------------------------------------------------

    def preview(self, params: Params, ctx: Context) -> Preview:
        prepared = self._prepare(params, ctx)
        git = Git(prepared.cache)
        span = _diff_span(prepared.base, prepared.new)
        stat = git("diff", "--stat", *span).stdout
        patch = git("diff", *span).stdout
        log = git("log", "--format=%h %an <%ae>%n    %s", *_log_span(prepared)).stdout
        facts = [
            ("remote", f"{prepared.remote.name} ({prepared.remote.url})"),
            ("branch", f"{params['branch']} ({'new' if prepared.current is None else 'update'})"),
            ("commit", prepared.new),
            ("compared with", prepared.base[:12]),
        ]
        expected = params["expected_old"]
        if (expected or None) != prepared.current:
            facts.append(
                (
                    "moved",
                    f"the branch is now at {str(prepared.current)[:12]}, not "
                    f"{str(expected)[:12]}: the push will be refused",
                )
            )
        touched = self._protected(prepared, params, ctx)
        if touched:
            facts.append(("PROTECTED PATHS", ", ".join(touched)))
        if len(patch) > MAX_PATCH:
            facts.append(("truncated", f"the patch is {len(patch)} bytes; shown: {MAX_PATCH}"))
            patch = patch[:MAX_PATCH]
        return Preview(
            title=f"push {prepared.new[:12]} to {prepared.remote.name}/{params['branch']}",
            target=f"git: {prepared.remote.url} refs/heads/{params['branch']}",
            body=f"{log}\n{stat}\n{patch}",
            body_kind="diff",
            facts=tuple(facts),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        remote = self._remote(params, ctx, "write")
        with _lock(remote.name):
            prepared = self._prepare(params, ctx, "write")  # the same token: one per call
            branch = params["branch"]
            out: JSON = {
                "remote": remote.name,
                "branch": branch,
                "new": prepared.new,
                "old": params["expected_old"],
            }
            if prepared.current == prepared.new:
                return {**out, "pushed": False}  # already there: a retry after a crash
            touched = self._protected(prepared, params, ctx)
            if touched and not params.get("touch_protected"):
                raise InvalidParams(
                    "/params/touch_protected",
                    f"the change touches protected paths ({', '.join(touched[:5])}); set "
                    "touch_protected: true if intended (a person must approve it)",
                    "protected_path",
                )
            assessed = (ctx.recall() or {}).get("protected", [])
            unseen = sorted(set(touched) - set(assessed))
            if unseen:
                raise EffectFailed(
                    f"failed: the change now touches protected paths its assessment did not "
                    f"see ({', '.join(unseen[:5])}); nothing was pushed: send the request again"
                )
            self._push(prepared.cache, remote, prepared.new, branch, params["expected_old"])
            return {**out, "pushed": True, "commits": self._count(prepared)}

    def _count(self, prepared: Prepared) -> int:
        counted = Git(prepared.cache)("rev-list", "--count", *_log_span(prepared))
        return int(counted.stdout.strip() or 0)

    @staticmethod
    def _push(cache: Path, remote: Remote, new: str | None, branch: str, lease: str | None) -> None:
        target = f"refs/heads/{branch}"
        source = f"{new}:{target}" if new else f":{target}"
        done = Git(cache, remote)(
            "push",
            "--porcelain",
            f"--force-with-lease={target}:{lease or ''}",
            remote.url,
            source,
            check=False,
        )
        if done.returncode != 0:
            text = done.stdout + done.stderr
            if "stale info" in text or "rejected" in text or "fetch first" in text:
                raise EffectFailed(
                    f"failed: {branch} on {remote.name} moved since the request was made; "
                    "fetch, rebase and send a new bundle with the new expected_old"
                )
            tail = " ".join(done.stderr.strip().splitlines()[-2:])[:300]
            raise EffectFailed(f"failed: the push to {remote.name} was refused: {tail}")

    def revert_preview(self, output: Mapping[str, Any], ctx: Context) -> Preview:
        what = (
            f"delete branch {output['branch']}"
            if output.get("old") is None
            else f"move {output['branch']} back to {str(output['old'])[:12]}"
        )
        still = str(output["new"])[:12]
        return Preview(
            title=f"{what} on {output['remote']} (only if it is still at {still})",
            target=f"git: {output['remote']} refs/heads/{output['branch']}",
        )

    def revert(self, output: Mapping[str, Any], ctx: Context) -> JSON:
        remote = self._remote({"remote": output["remote"]}, ctx, "write")
        with _lock(remote.name):
            cache = self._cache(remote, ctx)
            self._push(cache, remote, output.get("old"), output["branch"], output["new"])
        return {"branch": output["branch"], "restored": output.get("old")}


def _log_span(prepared: Prepared) -> list[str]:
    if prepared.base == _EMPTY_TREE:
        return [prepared.new]
    return [f"{prepared.base}..{prepared.new}"]
