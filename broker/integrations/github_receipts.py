"""Receipts where the artefact lives, sent once even across a crash.

Every call a thread is owed once its request moves (the answer to a `/broker`
command, the card edited in place, the `broker/approval` check completed, the
outcome posted, the draft or issue closed, the staging branch deleted) is first
queued in the thread store under a key that makes it one, then sent, then marked
sent. A broker that died in between sends what is still owed when it starts again
(broker.integrations.github_cards), and a receipt that was tried before is checked
against GitHub first: a reply whose hidden marker is already in the thread, or a
check run already completed so, is marked sent without being sent again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from broker.errors import BrokerError
from broker.faults import fault
from broker.integrations.github_store import Receipt, Thread
from broker.integrations.github_threads import GitHubThreads

__all__ = ["MARK", "closing_receipts", "send_owed", "unanswered"]

log = logging.getLogger("broker.integrations.github")
MARK = "<!-- broker-receipt {key} -->"
_sending = threading.Lock()  # the cards, the poller and the web in one process: one sender
OUTCOMES = {"applied": "success", "denied": "failure", "expired": "failure", "failed": "failure"}


def send_owed(threads: GitHubThreads, ref: str | None = None) -> int:
    """Send the receipts still owed (of thread `ref`, or every one); how many were sent.
    One GitHub does not take, or an answer still being decided, holds back the later
    ones of its thread (in order: the outcome never comes before the answer or the
    branch's deletion); other threads' go on."""
    with _sending:
        return _send_owed(threads, ref)


def _send_owed(threads: GitHubThreads, ref: str | None) -> int:
    sent, held = 0, set()
    for receipt in threads.store.owed(ref):
        thread = receipt.key.split("|", 1)[0]
        if thread in held:
            continue
        if receipt.call == "reply" and receipt.args.get("body") is None:
            held.add(thread)  # its words come when the decision does (PrDecider)
            continue
        threads.store.trying(receipt.key)
        try:
            if not (receipt.tries and _arrived(threads, receipt)):
                _send(threads, receipt)
        except BrokerError as exc:
            log.warning("a receipt in %s (%s) is still owed: %s", receipt.repo, receipt.key, exc)
            held.add(thread)
            continue
        fault("github_receipt_sent")  # the crash tests' point: sent, not yet marked
        threads.store.sent(receipt.key)
        sent += 1
    return sent


def unanswered(threads: GitHubThreads, before: float) -> None:
    """Answers queued before `before` that never got their words (a broker or web server
    died while deciding): say so, pointing at the card, which shows what was recorded."""
    for receipt in threads.store.owed(older_than=before):
        if receipt.call == "reply" and receipt.args.get("body") is None:
            who = str(receipt.args.get("login") or "someone")
            words = (
                f"**Not answered** (@{who}): the broker stopped while deciding on this "
                "comment; the card above shows what was recorded. If your decision is not "
                "on it, decide again."
            )
            threads.store.fill(receipt.key, {**receipt.args, "body": words})


def _send(threads: GitHubThreads, receipt: Receipt) -> None:
    api, repo, args = threads.api, receipt.repo, receipt.args
    if receipt.call == "reply":
        api.reply(repo, int(args["number"]), _marked(receipt))
    elif receipt.call == "edit_comment":
        api.edit_comment(repo, int(args["comment_id"]), str(args["body"]))
    elif receipt.call == "complete_check":
        output = {k: str(v) for k, v in dict(args["output"]).items()}
        api.complete_check(repo, int(args["run"]), str(args["conclusion"]), output)
    elif receipt.call == "close":
        close = api.close_issue if args.get("kind") == "issue" else api.close_pull
        close(repo, int(args["number"]))
    elif receipt.call == "delete_branch":
        try:
            api.delete_branch(repo, str(args["branch"]))
        except BrokerError as exc:
            if " 404 " not in str(exc) and " 422 " not in str(exc):
                raise  # 404/422: the branch is gone already
    else:
        raise BrokerError(f"unknown receipt call {receipt.call!r}")


def _arrived(threads: GitHubThreads, receipt: Receipt) -> bool:
    """Whether a receipt tried before reached GitHub (only replies and checks can tell,
    and only they would show twice; edits, closes and deletions are the same again)."""
    args = receipt.args
    if receipt.call == "reply":
        mark = MARK.format(key=receipt.key)
        comments = threads.api.comments(receipt.repo, int(args["number"]))
        return any(mark in str(c.get("body") or "") for c in comments)
    if receipt.call == "complete_check":
        status, conclusion = threads.api.check_state(receipt.repo, int(args["run"]))
        return status == "completed" and conclusion == args["conclusion"]
    return False


def _marked(receipt: Receipt) -> str:
    return f"{receipt.args['body']}\n\n{MARK.format(key=receipt.key)}"


def reply(thread: Thread, key: str, body: str | None, login: str = "") -> Receipt:
    """A reply in the thread; `body` None queues it ahead of its words (fill them in)."""
    args = {"number": thread.number, "body": body, "login": login}
    return Receipt(f"{thread.ref}|{key}", thread.repo, "reply", args)


def card_edit(thread: Thread, body: str, key: str) -> Receipt:
    return Receipt(
        f"{thread.ref}|{key}",
        thread.repo,
        "edit_comment",
        {"comment_id": thread.card_comment, "body": body},
    )


def closing_receipts(
    thread: Thread, card: Mapping[str, Any], card_body: str, output: Any
) -> list[Receipt]:
    """What a settled request's thread is owed, in the order it is sent."""
    ref, state = f"{thread.ref}|close", str(card["status"])
    owed = [card_edit(thread, card_body, "close:card")] if thread.card_comment else []
    if thread.check_run is not None and state in OUTCOMES:
        check = {
            "run": thread.check_run,
            "conclusion": OUTCOMES[state],
            "output": check_output(card),
        }
        owed.append(Receipt(f"{ref}:check", thread.repo, "complete_check", check))
    closing = {"number": thread.number, "kind": thread.kind}
    owed.append(Receipt(f"{ref}:close", thread.repo, "close", closing))
    if thread.branch:
        owed.append(
            Receipt(f"{ref}:branch", thread.repo, "delete_branch", {"branch": thread.branch})
        )
    owed.append(reply(thread, "close:outcome", outcome(card, output, thread)))
    return owed  # the outcome last: when the thread says it, the rest is done


def check_output(card: Mapping[str, Any]) -> dict[str, str]:
    return {
        "title": f"request {str(card['request_sha256'])[:12]}: {card['status']}",
        "summary": f"{card['effect']} {card['ref']}: {card.get('reason') or 'waiting'}",
    }


def outcome(card: Mapping[str, Any], output: Any, thread: Thread) -> str:
    """The thread's last word: applied (with the result's link), denied, expired, failed."""
    state = str(card["status"])
    gone = f" The staging branch `{thread.branch}` is deleted." if thread.branch else ""
    if state == "applied":
        return f"**Applied**: {_result(output)}.{gone}"
    if state == "expired":
        return f"**Expired**: nobody decided in time ({card.get('reason') or ''}).{gone}"
    return f"**{state.capitalize()}**: {card.get('reason') or ''}.{gone}"


def _result(output: Any) -> str:
    """The result's link (a pull request's), or what was pushed, or `done`."""
    if not isinstance(output, Mapping):
        return "done"
    url = output.get("url") or output.get("html_url")
    if url:
        return str(url)
    if output.get("branch") and output.get("new"):
        return f"pushed `{str(output['new'])[:12]}` to `{output['branch']}`"
    return "done"
