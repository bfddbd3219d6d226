"""Decisions from a pull request, bound to the request's digest.

Two ways to decide in the thread the broker opened (broker.integrations.github_threads):

- an APPROVE review whose `commit_id` is the head the broker pushed;
- a comment `/broker approve <sha256-prefix> [reason]` or `/broker deny <reason>`.

Each is checked, in this order, before it reaches the one decision path every surface
uses (a `Ballot` with surface `github`): the thread is one of the broker's; the comment
is as first written (not edited, not taken before); the commenter is not an agent's
account (`agent_logins`, or any Bot); the prefix (12+ hex digits) is the card's
sha256; the pull request's head is still the one shown; the commenter has write
access to the repository, read from GitHub now; their login is an approver's
`github_user`. Quorum, eligibility and the deadline are then `decide`'s. Every
command is answered in the thread, recorded or refused and why.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.approval.decisions import Ballot, Tally
from broker.errors import BrokerError, DecisionError
from broker.integrations import github_receipts as receipts
from broker.integrations.github_store import Thread
from broker.integrations.github_threads import GitHubThreads

__all__ = ["Command", "Event", "PrDecider", "card_markdown", "parse_command"]

log = logging.getLogger("broker.integrations.github")
COMMAND = re.compile(r"\A\s*/broker\s+(approve|deny)\b[ \t]*(.*)\Z", re.S)
PREFIX = re.compile(r"[0-9a-fA-F]{12,64}")
FENCE = "~~~~"
CARD_MARK = "<!-- broker-card {sha256} -->"


@dataclass(frozen=True)
class Command:
    """A `/broker` command as written: the verdict, the prefix given, the reason."""

    verdict: str
    prefix: str | None
    reason: str | None


def parse_command(body: str) -> Command | None:
    """The command in a comment's body, or None when the comment is not one."""
    match = COMMAND.match(body)
    if match is None:
        return None
    verdict, rest = match.group(1), match.group(2).strip()
    if verdict == "deny":
        return Command("deny", None, rest or None)
    head, _, reason = rest.partition(" ")
    return Command("approve", head or None, reason.strip() or None)


@dataclass(frozen=True)
class Event:
    """One comment or review, as a webhook delivery or the poller saw it."""

    kind: str  # comment | review
    repo: str
    number: int
    login: str
    user_type: str  # User | Bot
    body: str
    comment_id: int | None = None  # or the review's id
    action: str = "created"  # comment: created | edited; review: submitted
    review_state: str | None = None  # APPROVED | CHANGES_REQUESTED | COMMENTED
    commit_id: str | None = None

    @property
    def key(self) -> str:
        """What makes it one: a comment's first writing and each edit are looked at once."""
        return f"{self.kind}:{self.comment_id}:{self.action}"


class Refusal(Exception):
    """A command that decides nothing; its message is the thread's answer."""


class PrDecider:
    """Turns a pull request's comments and reviews into ballots, and answers them."""

    def __init__(
        self,
        threads: GitHubThreads,
        decide: Callable[[Ballot], Tally],
        card_of: Callable[[str, str], Mapping[str, Any]] | None = None,
    ) -> None:
        self.threads = threads
        self.decide = decide  # Inbox.decide on the web, decide_and_wake for the poller
        self.card_of = card_of  # the ledger's card (sandbox, id), to edit ours in place

    def handle(self, event: Event) -> str | None:
        """Decide on `event`; the answer posted in the thread (None: nothing to answer)."""
        thread = self.threads.store.by_pull(event.repo, event.number)
        if thread is None or self.threads.store.closed(thread.sandbox, thread.request_id):
            return None
        if event.comment_id and not self.threads.store.first_look(event.key):
            return None  # the webhook and the poller both saw it: it is looked at once
        # the answer is queued before the decision: the thread's outcome never comes first
        key = f"{thread.ref}|answer:{event.key}"
        self.threads.store.owe([receipts.reply(thread, f"answer:{event.key}", None, event.login)])
        answer = self._answer(thread, event)
        if answer is None:
            self.threads.store.forget(key)
        else:
            self.threads.store.fill(key, {"number": thread.number, "body": answer})
        receipts.send_owed(self.threads, thread.ref)  # else owed: sent when a broker starts
        return answer

    def _answer(self, thread: Thread, event: Event) -> str | None:
        """Decide on `event`; what the thread is told (None: it was not a command)."""
        try:
            ballot = self._ballot(thread, event)
            if ballot is None:
                return None
            tally = self.decide(ballot)
            if not tally.settled:
                self._refresh(thread)
            return _receipt(tally, ballot)
        except (Refusal, DecisionError) as exc:
            return f"**Refused** (@{event.login}): {exc}\n\nNothing was decided."
        except BrokerError as exc:  # GitHub did not answer a check: this one is not retried
            log.warning("a decision in %s#%d was not taken: %s", thread.repo, thread.number, exc)
            return (
                f"**Not recorded** (@{event.login}): the broker could not check this with "
                "GitHub just now. Nothing was decided; comment or review again."
            )

    def _refresh(self, thread: Thread) -> None:
        """The card edited in place: the approvals so far (a settled one, by PrCards)."""
        if self.card_of is None:
            return
        try:
            body = card_markdown(self.card_of(thread.sandbox, thread.request_id), thread)
            key = f"card:{hashlib.sha256(body.encode()).hexdigest()[:16]}"
            self.threads.store.owe([receipts.card_edit(thread, body, key)])  # after the answer
        except BrokerError as exc:
            log.warning("the card in %s#%d was not updated: %s", thread.repo, thread.number, exc)

    def _ballot(self, thread: Thread, event: Event) -> Ballot | None:
        if event.kind == "review":
            if event.review_state != "APPROVED" or thread.kind == "issue":
                return None
            self._who(thread, event)
            if event.commit_id != thread.head:
                raise Refusal(
                    f"this review is of commit {_short(event.commit_id)}, but the broker "
                    f"pushed {thread.head[:12]} for request {thread.sha256[:12]}; "
                    "review the change as it now stands"
                )
            verdict, reason = "approve", event.body.strip() or None
        else:
            command = parse_command(event.body)
            if command is None:
                return None
            self._as_written(thread, event)
            self._who(thread, event)
            verdict, reason = command.verdict, command.reason
            if command.verdict == "approve":
                _matches(command.prefix, thread.sha256)
            if command.verdict == "deny" and not reason:
                raise Refusal(
                    "a denial needs a reason (`/broker deny <reason>`): the agent reads it"
                )
        self._head_unmoved(thread)
        approver = self.threads.settings.users[event.login.casefold()]
        return Ballot(thread.ref, verdict, approver, reason, "github", thread.sha256)

    def _as_written(self, thread: Thread, event: Event) -> None:
        """Refuse an edited comment or one taken before: a decision is its first body."""
        if event.action != "created":
            raise Refusal("this comment was edited; a decision is a comment as first written")
        assert event.comment_id is not None
        now = self.threads.api.comment(thread.repo, event.comment_id)
        if now.get("body") != event.body or now.get("updated_at") != now.get("created_at"):
            raise Refusal("this comment was edited; a decision is a comment as first written")
        first = self.threads.store.take_comment(event.comment_id, event.body)
        if first is not None:
            if first == hashlib.sha256(event.body.encode()).hexdigest():
                raise Refusal("this comment was already taken; it decides once")
            raise Refusal("this comment was edited; a decision is a comment as first written")

    def _who(self, thread: Thread, event: Event) -> None:
        login = event.login.casefold()
        if event.user_type == "Bot" or login in self.threads.settings.agent_logins:
            raise Refusal(
                f"{event.login} is an agent's account; an agent never decides its own change"
            )
        if not self.threads.may_decide(thread.repo, event.login):
            raise Refusal(
                f"{event.login} does not have write access to {thread.repo} "
                "(read from GitHub just now)"
            )
        if login not in self.threads.settings.users:
            raise Refusal(
                f"{event.login} is not mapped to an approver; an operator can add "
                f'`github_user = "{event.login}"` to their [approvers.NAME] in broker.toml'
            )

    def _head_unmoved(self, thread: Thread) -> None:
        if thread.kind == "issue":
            return  # nothing was pushed: the digest on the card is the whole binding
        head = self.threads.api.head(thread.repo, thread.number)
        if head != thread.head:
            raise Refusal(
                f"the pull request's head moved to {head[:12]} after the broker pushed "
                f"{thread.head[:12]}; what was shown is not what would be applied"
            )


def _short(sha: str | None) -> str:
    """A commit id from a payload, shown only if it is one (no markup from outside)."""
    return sha[:12] if sha and re.fullmatch(r"[0-9a-f]{40}", sha) else "(not a commit id)"


def _matches(prefix: str | None, sha256: str) -> None:
    if prefix is None or not PREFIX.fullmatch(prefix):
        raise Refusal(
            "`/broker approve` needs the request's sha256 from the card (12 hex digits or more)"
        )
    if not sha256.startswith(prefix.lower()):
        raise Refusal(
            f"`{prefix[:16]}` is not the sha256 of this request (the card shows "
            f"`{sha256[:12]}…`); look at the card again"
        )


def _receipt(tally: Tally, ballot: Ballot) -> str:
    who = ballot.approver
    if ballot.verdict == "deny":
        return f"**Denied** by {who}: {ballot.reason}\n\nThe agent is told why."
    if not tally.settled:
        return (
            f"**Recorded**: approval by {who} ({tally.approvals} of {tally.needed}); "
            "waiting for more approvers."
        )
    return f"**Approved** by {who} ({tally.approvals} of {tally.needed}); the broker applies it."


def _quoted(text: str) -> str:
    """The agent's words in a fence it cannot close, with no @-mention that notifies."""
    safe = str(text).replace(FENCE, "~ ~ ~ ~").replace("@", "@\u200b")
    return f"{FENCE}text\n{safe}\n{FENCE}"


def card_markdown(card: Mapping[str, Any], thread: Thread) -> str:
    """The card comment: what, where, why it stopped, the deadline, the agent's words
    (marked as such), the request's sha256, and how to decide."""
    what = card.get("what") or {}
    why = card.get("why") or {}
    late = card.get("if_nobody_answers") or {}
    have = (card.get("approvals") or {}).get("have") or []
    need = (card.get("approvals") or {}).get("needed", 1)
    lines = [
        CARD_MARK.format(sha256=thread.sha256),
        f"### Broker approval: `{card.get('effect')}` ({card.get('status')})",
        "",
        f"**What**: {what.get('title', '')}",
        f"**Where**: {card.get('where')}",
        f"**Why it stopped**: {why.get('rule') or 'its rule'}: {why.get('reason') or ''}",
        f"**Deadline**: {late.get('expires_at')} (then {late.get('on_timeout')})",
        f"**Request sha256**: `{thread.sha256}`",
        f"**Approvals**: {len(have)} of {need}" + (f" ({', '.join(have)})" if have else ""),
        "",
        "**The agent's words** (written by the agent, not checked by the broker):",
        _quoted(str(card.get("agent_reason") or "(none)")),
        "",
    ]
    if thread.kind == "issue":
        lines += _artefact(what)
    if thread.branch:
        lines.append(_staged(card, thread))
    if card.get("status") == "pending":
        review = (
            f"an **Approve** review of commit `{thread.head[:12]}`, or "
            if thread.kind == "pull"
            else ""
        )
        lines += [
            f"To approve: {review}comment `/broker approve {thread.sha256[:16]} [reason]`.",
            "To deny: comment `/broker deny <reason>` (the agent reads the reason).",
        ]
    else:
        lines.append(f"Decided by {card.get('decided_by') or '-'}: {card.get('reason') or ''}")
    return "\n".join(lines)


def _staged(card: Mapping[str, Any], thread: Thread) -> str:
    """What the staging branch is, and that it goes away."""
    if card.get("effect") == "git.push":
        return (
            f"The broker pushed the agent's **unapproved** commit `{thread.head[:12]}` to branch "
            f"`{thread.branch}` for this review; nothing reaches the branch the agent asked "
            "for until it is approved. The staging branch is deleted when the request is "
            "applied, denied or expires."
        )
    return (
        f"The broker created branch `{thread.branch}` at `{thread.head[:12]}` for this "
        "review; it is deleted when the request is applied, denied or expires."
    )


def _artefact(what: Mapping[str, Any]) -> list[str]:
    """An issue thread shows the exact artefact (there is no diff beside it): the
    preview's facts and body, in a fence, as the broker computed them."""
    facts = [f"- {_inline(k)}: {_inline(v)}" for k, v in (what.get("facts") or [])]
    body = str(what.get("body") or "")
    lines = ["**What would be done** (computed by the broker from the request):", *facts]
    if body:
        lines.append(_quoted(body[:60000]))
    return [*lines, ""]


def _inline(value: Any) -> str:
    """A fact on one line, no markup or mention from outside."""
    text = " ".join(str(value).split()).replace("`", "'").replace("@", "@\u200b")
    return f"`{text[:300]}`"
