"""github.issue.create, github.issue.comment, github.pull_request.comment and
github.label.add: each previews what it will post and undoes what it did."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from broker.errors import EffectFailed, InvalidParams
from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context
from effects.github.api import Api, number_of, pick
from effects.github.handler import GitHubHandler
from effects.github.text import mention_facts, oneline, thread_line


class IssueCreate(GitHubHandler):
    """Open an issue."""

    name = "github.issue.create"
    identifying = ("repo", "labels")
    reversible = False
    idempotent = False
    undo = (
        "`broker undo` closes the issue as not planned (GitHub's REST API cannot delete "
        "it); the notifications it sent stay"
    )

    def preview(self, params: Params, ctx: Context) -> Preview:
        text = self._text(ctx)
        title, body = text(params["title"]), text(params.get("body"))
        facts = [("repo", params["repo"])]
        if params.get("labels"):
            facts.append(("labels", ", ".join(params["labels"])))
        return Preview(
            title=f"open an issue in {params['repo']}: {oneline(title)}",
            target=f"github: {params['repo']} issues",
            body=f"{title}\n\n{body}",
            facts=tuple(facts + mention_facts(text)),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        text = self._text(ctx)
        title, body = text(params["title"]), text(params.get("body"))
        with self._edge(f"opening an issue in {params['repo']}", ctx):
            api = self._api(params, ctx, write=True)
            issue = api.create_issue(title=title, body=body, labels=params.get("labels", []))
        return {
            "repo": params["repo"],
            "number": number_of(pick(issue, "number")),
            "url": str(pick(issue, "html_url")),
            "labels": list(params.get("labels", [])),
            "mentions_neutralised": text.mentions,
        }

    def revert_preview(self, output: Mapping[str, Any], ctx: Context) -> Preview:
        return Preview(
            title=f"close issue #{output['number']} in {output['repo']} as not planned",
            target=f"github: {output['url']}",
        )

    def revert(self, output: Mapping[str, Any], ctx: Context) -> JSON:
        number = int(output["number"])
        with self._edge(f"closing issue #{number} in {output['repo']}", ctx):
            api = self._api(output, ctx, write=True)
            if api.issue(number).get("state") == "closed":
                return {"number": number, "closed": False, "note": "it was closed already"}
            api.close_issue(number)
        return {"number": number, "closed": True}


class _Comment(GitHubHandler):
    """A comment on an issue or a pull request's conversation."""

    reversible = False
    idempotent = False
    undo = "`broker undo` deletes the comment; the notifications it sent (e-mail included) stay"
    kind = ""

    def _target(self, api: Api, number: int) -> dict[str, Any]:
        raise NotImplementedError

    def preview(self, params: Params, ctx: Context) -> Preview:
        text = self._text(ctx)
        body = text(params["body"])
        number = int(params["number"])
        with self._edge(f"reading {self.kind} #{number} in {params['repo']}", ctx):
            thread = self._target(self._api(params, ctx), number)
        facts = [("on", thread_line(thread)), ("url", str(thread.get("html_url", "")))]
        return Preview(
            title=f"comment on {self.kind} #{number} in {params['repo']}",
            target=f"github: {thread.get('html_url') or params['repo']}",
            body=body,
            facts=tuple(facts + mention_facts(text)),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        text = self._text(ctx)
        body = text(params["body"])
        number = int(params["number"])
        with self._edge(f"commenting on {self.kind} #{number} in {params['repo']}", ctx):
            api = self._api(params, ctx, write=True)
            self._target(api, number)
            made = api.comment(number, body)
        return {
            "repo": params["repo"],
            "number": number,
            "id": number_of(pick(made, "id")),
            "url": str(pick(made, "html_url")),
            "mentions_neutralised": text.mentions,
        }

    def revert_preview(self, output: Mapping[str, Any], ctx: Context) -> Preview:
        return Preview(
            title=f"delete comment {output['id']} on #{output['number']} in {output['repo']}",
            target=f"github: {output['url']}",
        )

    def revert(self, output: Mapping[str, Any], ctx: Context) -> JSON:
        with self._edge(f"deleting comment {output['id']} in {output['repo']}", ctx):
            api = self._api(output, ctx, write=True)
            from github.GithubException import UnknownObjectException

            try:
                api.delete_comment(int(output["id"]))
            except UnknownObjectException:
                return {"id": output["id"], "deleted": False, "note": "it was deleted already"}
        return {"id": output["id"], "deleted": True}


class IssueComment(_Comment):
    """Comment on an issue (not a pull request: that is github.pull_request.comment)."""

    name = "github.issue.comment"
    identifying = ("repo", "number")
    kind = "issue"

    def _target(self, api: Api, number: int) -> dict[str, Any]:
        issue = api.issue(number)
        if issue.get("pull_request"):
            # separate effects, so a policy can treat them apart
            raise InvalidParams(
                "/params/number",
                f"#{number} in {api.repo} is a pull request; use github.pull_request.comment",
                "is_pull_request",
            )
        return issue


class PullRequestComment(_Comment):
    """Comment on a pull request's conversation."""

    name = "github.pull_request.comment"
    identifying = ("repo", "number")
    kind = "pull request"
    permissions = ("pull_requests",)

    def _target(self, api: Api, number: int) -> dict[str, Any]:
        from github.GithubException import UnknownObjectException

        try:
            return api.pull(number)
        except UnknownObjectException as exc:
            raise InvalidParams(
                "/params/number",
                f"{api.repo} has no pull request #{number} (an issue? use github.issue.comment)",
                "not_a_pull_request",
            ) from exc


class LabelAdd(GitHubHandler):
    """Add labels to an issue or a pull request."""

    name = "github.label.add"
    identifying = ("repo", "number", "labels")
    # removing a label is easy, but a `labeled` event may already have started a workflow
    # (deploys, "safe to test" runs with secrets): not reversible, like git.push
    reversible = False
    idempotent = True
    undo = (
        "`broker undo` removes the labels this request added (not those already there); "
        "workflows their `labeled` events started stay"
    )

    def preview(self, params: Params, ctx: Context) -> Preview:
        number = int(params["number"])
        with self._edge(f"reading #{number} in {params['repo']}", ctx):
            api = self._api(params, ctx)
            thread = api.issue(number)
            now = api.labels(number)
        new = _missing(params["labels"], now)
        facts = [
            ("on", thread_line(thread)),
            ("labels now", ", ".join(now) or "none"),
            ("added", ", ".join(new) or "none: all are there already"),
        ]
        return Preview(
            title=f"label #{number} in {params['repo']}: {', '.join(params['labels'])}",
            target=f"github: {thread.get('html_url') or params['repo']}",
            facts=tuple(facts),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        number = int(params["number"])
        with self._edge(f"labelling #{number} in {params['repo']}", ctx):
            api = self._api(params, ctx, write=True)
            new = _missing(params["labels"], api.labels(number))
            labels = api.add_labels(number, new) if new else api.labels(number)
        return {"repo": params["repo"], "number": number, "added": new, "labels": labels}

    def revert_preview(self, output: Mapping[str, Any], ctx: Context) -> Preview:
        added = list(output.get("added") or [])
        if not added:
            raise EffectFailed("failed: this request added no label; there is nothing to remove")
        return Preview(
            title=f"remove {', '.join(added)} from #{output['number']} in {output['repo']}",
            target=f"github: {output['repo']}",
        )

    def revert(self, output: Mapping[str, Any], ctx: Context) -> JSON:
        number = int(output["number"])
        removed = []
        with self._edge(f"removing labels from #{number} in {output['repo']}", ctx):
            api = self._api(output, ctx, write=True)
            for label in output.get("added") or []:
                from github.GithubException import UnknownObjectException

                try:
                    api.remove_label(number, label)
                    removed.append(label)
                except UnknownObjectException:
                    pass  # removed by someone already
        return {"number": number, "removed": removed}


def _missing(wanted: Sequence[str], present: Sequence[str]) -> list[str]:
    have = {p.lower() for p in present}
    out: list[str] = []
    for label in wanted:
        if label.lower() not in have and label not in out:
            out.append(label)
    return out
