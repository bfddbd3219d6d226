"""github.pull_request.create: a pull request from a pushed branch, or from `files` the
host commits on a new branch through the Git Data API.

The preview is the diff GitHub will show; what it was computed on (base and head
commits, each file's blob) is remembered with the request (`ctx.remember`) and
re-checked first at apply: what moved since makes the result `failed`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from broker.errors import EffectFailed, InvalidParams
from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context
from effects.github.api import Api, number_of, pick
from effects.github.changes import TEAM, Change, changes, reviewers
from effects.github.diffs import compare_diff, files_diff
from effects.github.errors import translate
from effects.github.handler import GitHubHandler
from effects.github.live import Live, conflicts, read_live, recheck
from effects.github.text import Text, mention_facts, oneline
from effects.normal_forms import branch_name, relative_path

MAX_DIFF = 1 << 20  # characters of diff shown to the approver
Facts = list[tuple[str, str]]


class PullRequestCreate(GitHubHandler):
    """Open a pull request from a pushed branch, or from files the host commits."""

    name = "github.pull_request.create"
    identifying = ("repo", "base", "head", "reviewers")
    reversible = False
    idempotent = True
    undo = (
        "`broker undo` closes the pull request and deletes the branch the host created "
        "for `files` (if nobody moved it); notifications and CI runs it started stay"
    )

    assess_inline = True  # protected_for reads params and settings only
    permissions = ("contents", "pull_requests")

    def needs(self, params: Params) -> tuple[str, ...]:
        """Contents and pull requests; issues too when labels go on the pull request."""
        return (*self.permissions, "issues") if params.get("labels") else self.permissions

    def canonical(self, params: Params, ctx: Context) -> Params:
        """The repo in lower case, plain branch names, each file's path in its one form."""
        params = super().canonical(params, ctx)
        for key in ("base", "head"):
            branch_name(params[key], f"/params/{key}")
        if not params.get("files"):
            return params
        files = [
            {**item, "path": relative_path(item["path"], f"/params/files/{i}/path")}
            for i, item in enumerate(params["files"])
        ]
        return {**params, "files": files}

    def protected_for(self, params: Params, ctx: Context) -> Sequence[str]:
        """The `files` paths protected in the repository ([repositories.NAME])."""
        globs = ctx.repositories.for_github(params["repo"])
        return [c.path for c in changes(params) if any(fnmatchcase(c.path, g) for g in globs)]

    def check(self, params: Params, ctx: Context) -> None:
        super().check(params, ctx)
        if params["head"] == params["base"]:
            raise InvalidParams("/params/head", "head and base are the same branch")
        changes(params)
        owner = params["repo"].split("/")[0].lower()
        for i, name in enumerate(params.get("reviewers") or []):
            team = TEAM.fullmatch(name)
            if team and team.group(1).lower() != owner:
                raise InvalidParams(
                    f"/params/reviewers/{i}", f"team {name} is not in {owner}'s organisation"
                )

    # -- preview

    def preview(self, params: Params, ctx: Context) -> Preview:
        text = self._text(ctx)
        title, body = text(params["title"]), text(params.get("body"))
        message = text(params.get("commit_message") or params["title"])
        changed = changes(params)
        with self._edge(f"reading {params['repo']}", ctx):
            api = self._api(params, ctx)
            live = read_live(api, params, changed)
            existing = api.open_pulls(params["head"], params["base"])
            diff, facts = files_diff(api, live, changed) if changed else compare_diff(api, live)
            found = conflicts(api, params, live, changed)
        ctx.remember(live.seen())
        lines = _facts(params, live, bool(changed), facts, found, existing)
        touched = self.protected_for(params, ctx)
        if touched:
            lines.append(("PROTECTED PATHS", ", ".join(touched)))
        if changed:
            lines.append(("commit message", oneline(message)))
        lines += mention_facts(text)
        shown = f"Title: {title}\n\n{body or '(no description)'}\n\n{'=' * 72}\n{diff}"
        if len(shown) > MAX_DIFF:
            lines.append(
                ("truncated", f"the preview is {len(shown)} characters; shown: {MAX_DIFF}")
            )
            shown = shown[:MAX_DIFF]
        return Preview(
            title=f"open a pull request in {params['repo']}: {params['head']} → {params['base']}"
            f": {oneline(title)}",
            target=f"github: {params['repo']} pull request {params['base']} ← {params['head']}",
            body=shown,
            body_kind="diff",
            facts=tuple(lines),
        )

    # -- apply

    def apply(self, params: Params, ctx: Context) -> JSON:
        with self._edge(f"opening a pull request in {params['repo']}", ctx):
            return self._apply(self._api(params, ctx, write=True), params, ctx, ctx.recall())

    def _apply(
        self, api: Api, params: Params, ctx: Context, seen: Mapping[str, Any] | None
    ) -> JSON:
        text = self._text(ctx)
        title, body = text(params["title"]), text(params.get("body"))
        message = text(params.get("commit_message") or params["title"])
        existing = api.open_pulls(params["head"], params["base"])
        if existing:
            return self._output(existing[0], params, text, created=False, branch_created=False)
        changed = changes(params)
        live = read_live(api, params, changed)
        recheck(api, params, live, seen, bool(changed))
        branch_created = False
        if changed:
            found = conflicts(api, params, live, changed)
            if found:
                raise EffectFailed(f"failed: {found[0]}; nothing was done")
            branch_created = self._commit(api, params, live, changed, message)
        pull, created = self._open(api, params, title, body)
        if not created:
            return self._output(pull, params, text, created=False, branch_created=branch_created)
        warnings = self._follow_up(api, params, number_of(pick(pull, "number")), ctx)
        out = self._output(pull, params, text, created=True, branch_created=branch_created)
        out["warnings"] = warnings
        return out

    @staticmethod
    def _open(api: Api, params: Params, title: str, body: str) -> tuple[dict[str, Any], bool]:
        """The pull request, and whether this request created it."""
        head, base = params["head"], params["base"]
        from github.GithubException import GithubException

        try:
            pull = api.create_pull(
                head=head, base=base, title=title, body=body, draft=bool(params.get("draft"))
            )
        except GithubException as exc:
            again = api.open_pulls(head, base) if exc.status == 422 else []
            if not again:
                raise
            return again[0], False  # a pull request for head→base opened meanwhile
        return pull, True

    def _follow_up(self, api: Api, params: Params, number: int, ctx: Context) -> list[str]:
        """Labels and reviewers; the pull request exists now, so a failure is a warning."""
        warnings = []
        users, teams = reviewers(params)
        steps: list[tuple[str, Callable[[], object]]] = []
        if params.get("labels"):
            steps.append(("adding labels", lambda: api.add_labels(number, params["labels"])))
        if users or teams:
            steps.append(
                ("requesting reviewers", lambda: api.request_reviewers(number, users, teams))
            )
        import requests
        from github.GithubException import GithubException

        for doing, step in steps:
            try:
                step()
            except (GithubException, requests.RequestException) as exc:
                warnings.append(translate(exc, f"{doing} to #{number}", self._url(ctx)).reason)
        return warnings

    def _commit(
        self, api: Api, params: Params, live: Live, changed: Sequence[Change], message: str
    ) -> bool:
        """Commit `files` on base as the new branch head; False if this request did already."""
        assert live.base_tree is not None and live.entries is not None
        tree_entries: list[dict[str, Any]] = []
        for c in changed:
            entry = live.entries.get(c.path)
            mode = entry.mode if entry is not None else "100644"
            sha = None if c.data is None else api.create_blob(c.data)
            tree_entries.append({"path": c.path, "mode": mode, "type": "blob", "sha": sha})
        tree = api.create_tree(live.base_tree, tree_entries)
        if tree == live.base_tree:
            raise EffectFailed(
                f"failed: the files change nothing on {params['base']}; nothing was done"
            )
        head = params["head"]
        if live.head_sha is not None:
            return self._ours(api, head, live.head_sha, tree, live.base_sha)
        commit = api.create_commit(message, tree, [live.base_sha])
        from github.GithubException import GithubException

        try:
            api.create_branch(head, commit)
        except GithubException as exc:
            now = api.branch_sha(head) if exc.status == 422 else None
            if now is None:
                raise
            return self._ours(api, head, now, tree, live.base_sha)
        return True

    @staticmethod
    def _ours(api: Api, head: str, at: str, tree: str, base: str) -> bool:
        """An existing head is fine only if it holds exactly this change (a retry)."""
        found = api.commit(at)
        if found.tree == tree and found.parents == (base,):
            return True
        raise EffectFailed(
            f"failed: branch {head} already exists in {api.repo} with other commits; choose a "
            "new head name (with files the host creates the branch)"
        )

    @staticmethod
    def _output(
        pull: Mapping[str, Any],
        params: Params,
        text: Text,
        *,
        created: bool,
        branch_created: bool,
    ) -> JSON:
        return {
            "repo": params["repo"],
            "number": number_of(pick(pull, "number")),
            "url": str(pick(pull, "html_url")),
            "head": params["head"],
            "base": params["base"],
            "head_sha": str((pull.get("head") or {}).get("sha", "")),
            "created": created,
            "branch_created": branch_created,
            "draft": bool(pull.get("draft", False)),
            "labels": list(params.get("labels") or []) if created else [],
            "reviewers": list(params.get("reviewers") or []) if created else [],
            "mentions_neutralised": text.mentions,
        }

    # -- undo

    def revert_preview(self, output: Mapping[str, Any], ctx: Context) -> Preview:
        self._undoable(output)
        extra = (
            f", and delete branch {output['head']} (only if still at "
            f"{str(output['head_sha'])[:12]})"
            if output.get("branch_created")
            else ""
        )
        return Preview(
            title=f"close pull request #{output['number']} in {output['repo']}{extra}",
            target=f"github: {output['url']}",
        )

    @staticmethod
    def _undoable(output: Mapping[str, Any]) -> None:
        if not output.get("created"):
            raise EffectFailed(
                f"failed: this request found pull request #{output.get('number')} already open "
                "and did not create it; close it on GitHub if it should go"
            )

    def revert(self, output: Mapping[str, Any], ctx: Context) -> JSON:
        self._undoable(output)
        number = int(output["number"])
        done: JSON = {"number": number, "closed": False, "branch_deleted": False}
        with self._edge(f"closing pull request #{number} in {output['repo']}", ctx):
            api = self._api(output, ctx, write=True)
            pull = api.pull(number)
            if pull.get("merged"):
                raise EffectFailed(
                    f"failed: pull request #{number} was merged; closing cannot undo that: "
                    "revert the merge commit on GitHub"
                )
            if pull.get("state") == "open":
                api.close_pull(number)
                done["closed"] = True
            if output.get("branch_created"):
                now = api.branch_sha(str(output["head"]))
                if now is not None and now == output.get("head_sha"):
                    api.delete_branch(str(output["head"]))
                    done["branch_deleted"] = True
                elif now is not None:
                    done["note"] = f"{output['head']} moved since; it was left in place"
        return done


def _facts(
    params: Params,
    live: Live,
    files: bool,
    diff_facts: Facts,
    found: Sequence[str],
    existing: Sequence[Mapping[str, Any]],
) -> Facts:
    """What the approver reads beside the diff: where, what moved, what will fail."""
    lines: Facts = [
        ("repo", params["repo"]),
        ("base", f"{params['base']} @ {live.base_sha[:12]}"),
        _head_fact(params, live, files),
        *diff_facts,
    ]
    agent = params.get("base_sha")
    if agent and agent != live.base_sha:
        lines.append(
            (
                "base moved",
                f"{params['base']} is at {live.base_sha[:12]} now; the agent worked from "
                f"{agent[:12]}",
            )
        )
    for why in found:
        lines.append(("CONFLICT (applying will fail)", why))
    if existing:
        lines.append(
            (
                "already open",
                f"#{existing[0].get('number')} {existing[0].get('html_url')}: applying "
                "returns it and creates nothing",
            )
        )
    if params.get("draft"):
        lines.append(("draft", "yes"))
    if params.get("labels"):
        lines.append(("labels", ", ".join(params["labels"])))
    if params.get("reviewers"):
        lines.append(("reviewers", ", ".join(params["reviewers"])))
    return lines


def _head_fact(params: Params, live: Live, files: bool) -> tuple[str, str]:
    if not files:
        return ("head", f"{params['head']} @ {str(live.head_sha)[:12]}")
    exists = (
        ""
        if live.head_sha is None
        else f" (EXISTS at {live.head_sha[:12]}: applying will fail unless it "
        "holds exactly these changes)"
    )
    return ("head", f"{params['head']}: a new branch the host commits the files on{exists}")
