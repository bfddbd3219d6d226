"""Where a waiting request's approval thread goes, and opening it.

- `github.pull_request.create`: a ref at the head the agent already pushed, on a
  broker-owned branch; nothing new is pushed.
- `git.push` to a remote that is a GitHub repository (`[repositories.NAME]` with
  `github` and `git_remotes`, or a github.com URL): the bundle's commit, which is only
  in the request, pushed with real git to the broker-owned branch (effects.gitstage):
  the agent's unapproved change is on the remote from then on, and the card says so.
- anything else (S3, HTTP, email, webhooks…), and a git.push whose remote is not on
  GitHub: an issue in `issues_repo`, when one is configured.

A staging branch is `staging_prefix + <request id>`: never the request's branch or
base, never one of `[integrations.git] protected_branches`, and never in a public
repository unless `staging_public = true`. It is deleted when the request settles.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from broker.config import Config
from broker.context import opened
from broker.errors import BrokerError, EffectFailed
from broker.integrations.github_store import Thread
from broker.integrations.github_threads import APPROVAL_EFFECTS, GitHubThreads, ThreadSettings

if TYPE_CHECKING:
    from broker.models import Record
    from broker.registry import Registry

__all__ = ["Keep", "Stager", "thread_kind"]

log = logging.getLogger("broker.integrations.github")
Keep = Callable[[Thread], None]
"""Remembers a thread as far as it is opened (ThreadStore.add)."""
GITHUB_URL = re.compile(r"github\.com[:/]([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?)(?:\.git)?/?\Z")
DRAFT_BODY = "Staged by the broker for approval; the card is the first comment."
ISSUE_BODY = "Opened by the broker for approval; the card is the first comment."


def thread_kind(settings: ThreadSettings, record: Record) -> str | None:
    """`pull`, `issue` or None: where this waiting request is approved on GitHub (a
    rule's own approve_in_pr wins over the integration's)."""
    said = (record.verdict or {}).get("approve_in_pr")
    if not (settings.default_on if said is None else said):
        return None
    if record.effect in APPROVAL_EFFECTS:
        return "pull"
    return "issue" if settings.issues_repo else None


@dataclass(frozen=True)
class _Pull:
    repo: str
    head: str
    base: str
    branch: str


class Stager:
    """Opens the thread of one waiting request: stages the change, or opens an issue."""

    def __init__(self, threads: GitHubThreads, config: Config, registry: Registry) -> None:
        self.threads = threads
        self.config = config
        self.registry = registry

    def open(self, card: Mapping[str, Any], record: Record) -> Thread | None:
        """The thread for `record`, its draft or issue opened (the card and check are
        then `finish`'s), or None when it has none."""
        pull = self._stage(card, record) if record.effect in APPROVAL_EFFECTS else None
        if pull is None and record.effect == "github.pull_request.create":
            return None
        api, settings = self.threads.api, self.threads.settings
        sha256 = str(card["request_sha256"])
        title = str((card.get("what") or {}).get("title") or record.effect)
        if pull is not None:
            number = self._draft(pull, f"[broker] {title}")
            return Thread(
                record.sandbox,
                record.id,
                sha256,
                pull.repo,
                number,
                pull.head,
                0,
                None,
                pull.branch,
            )
        if settings.issues_repo:
            repo = settings.issues_repo
            number = api.issue(repo, f"[broker] {record.effect}: {title}"[:250], ISSUE_BODY)
            return Thread(record.sandbox, record.id, sha256, repo, number, "", 0, kind="issue")
        return None

    def _draft(self, pull: _Pull, title: str) -> int:
        """The draft from the staging branch; one a crash left open is the same draft."""
        api = self.threads.api
        try:
            return api.draft(pull.repo, pull.branch, pull.base, title, DRAFT_BODY)
        except EffectFailed as exc:
            if (
                " 422 " not in str(exc)
                or (number := api.open_draft(pull.repo, pull.branch)) is None
            ):
                raise
            return number

    def finish(self, card: Mapping[str, Any], thread: Thread, keep: Keep) -> None:
        """Post what an opened thread still lacks, keeping each step as it is done: the
        card (unless a card of this request is there already: a crash after posting it)
        and, on a pull request, the queued check run."""
        from broker.integrations.github_decisions import CARD_MARK, card_markdown
        from broker.integrations.github_receipts import check_output

        api = self.threads.api
        if not thread.card_comment:
            mark = CARD_MARK.format(sha256=thread.sha256)
            there = [c for c in api.comments(thread.repo, thread.number) if mark in c["body"]]
            comment = (
                there[0]
                if there
                else api.reply(thread.repo, thread.number, card_markdown(card, thread))
            )
            thread = replace(thread, card_comment=int(comment["id"]))
            keep(thread)
        if thread.kind == "pull" and thread.check_run is None:
            mine = f"request {thread.sha256[:12]}:"  # a run a crash left unrecorded
            runs = [
                int(r["id"])
                for r in api.check_runs(thread.repo, thread.head)
                if str((r.get("output") or {}).get("title") or "").startswith(mine)
            ]
            run = runs[0] if runs else api.check_run(thread.repo, thread.head, check_output(card))
            keep(replace(thread, check_run=run))

    def _stage(self, card: Mapping[str, Any], record: Record) -> _Pull | None:
        params = dict(record.envelope.get("params") or {})
        repo = self._repo(record.effect or "", params)
        if repo is None:
            return None
        if not self.threads.settings.staging_public and not self.threads.api.private(repo):
            log.warning("%s is public: no staging branch (staging_public = false)", repo)
            return None
        branch = f"{self.threads.settings.staging_prefix}{record.id}"
        self._may_stage(branch, params)
        if record.effect == "github.pull_request.create":
            head = self.threads.api.branch_sha(repo, str(params["head"]))
            self._ref(repo, branch, head)
            return _Pull(repo, head, str(params["base"]), branch)
        return self._push(record, params, repo, branch)

    def _ref(self, repo: str, branch: str, head: str) -> None:
        """The staging ref at `head`; one a crash left there already is the same ref."""
        api = self.threads.api
        try:
            api.create_branch(repo, branch, head)
        except EffectFailed as exc:
            if " 422 " not in str(exc) or api.branch_sha(repo, branch) != head:
                raise

    def _push(self, record: Record, params: dict[str, Any], repo: str, branch: str) -> _Pull:
        from effects.git import GitPush
        from effects.gitstage import stage_push

        handler = self.registry.effect("git.push").handler
        if not isinstance(handler, GitPush):
            raise BrokerError("git.push is not the built-in handler: its change is not staged")
        with opened(self.config, record) as ctx:
            staged = stage_push(handler, params, ctx, branch)
        return _Pull(repo, staged.commit, staged.base, branch)

    def _repo(self, effect: str, params: Mapping[str, Any]) -> str | None:
        if effect == "github.pull_request.create":
            return str(params["repo"])
        name = str(params.get("remote") or "")
        for table in self.config.repositories.tables:
            if name in table.remotes and table.github:
                return table.github
        remotes = self.config.integration("git").get("remotes") or {}
        url = str((remotes.get(name) or {}).get("url") or "")
        found = GITHUB_URL.search(url)
        return found.group(1) if found else None

    def _may_stage(self, branch: str, params: Mapping[str, Any]) -> None:
        """Never the request's own branch or base, never a protected branch."""
        own = {params.get("base"), params.get("branch"), params.get("head")}
        if branch in own:
            raise BrokerError(f"the staging branch {branch} would be the request's own branch")
        for glob in self.config.integration("git").get("protected_branches") or []:
            if fnmatchcase(branch, str(glob)):
                raise BrokerError(f"the staging branch {branch} is protected ({glob})")
