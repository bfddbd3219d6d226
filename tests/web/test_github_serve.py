"""`broker serve` as a process, with the web server, approving in the pull request
against the GitHub stand-in: the serving broker opens the draft and its card, a signed
`/broker approve` comment delivered to its webhook applies the request, and the
thread, the check run and the staging branch follow."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.effects.github.fake import commit_on, seed_repo
from tests.effects.github.fake_reviews import ReviewingGitHub, comment_payload, delivery
from tests.effects.github.support import REPO, SEED, TOKEN, TOKEN_ENV
from tests.support import TLS, Serving, eventually

SECRET = "whsec-serve-0123456789"
SECRET_ENV = "TEST_GITHUB_WEBHOOK_SECRET"
POLICY = """
[[rules]]
effect = "github.pull_request.create"
action = "approve"
reason = "a person reviews every pull request the agent opens"
"""


def test_serve_approves_in_the_pull_request(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real `broker serve`: draft + card + queued check; alice's signed comment with the
    card's sha256 prefix applies the request once; the check succeeds, the branch goes."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    remote = tmp_path / "api.git"
    seed_repo(remote, SEED)
    commit_on(remote, "agent/fix", {"src/app.py": b"x = 2\n"}, start="main")
    outbox, results, state = (tmp_path / d for d in ("outbox", "results", "state"))
    for d in (outbox, results, state):
        d.mkdir()
    with ReviewingGitHub(token=TOKEN) as hub:
        hub.add_repo(REPO, remote)
        hub.private.add(REPO)
        hub.permissions[(REPO, "alice-gh")] = "write"
        (tmp_path / "broker.toml").write_text(
            f"""
[integrations.github]
token_env = "{TOKEN_ENV}"
base_url = "{hub.url}"
repos = ["acme/*"]
approve_in_pr = true
webhook_secret_env = "{SECRET_ENV}"

[approvers.alice]
github_user = "alice-gh"
""",
            encoding="utf-8",
        )
        (tmp_path / "policy.toml").write_text(POLICY, encoding="utf-8")
        serving = Serving(
            home,
            *("--config", str(tmp_path / "broker.toml"), "--policy", str(tmp_path / "policy.toml")),
            *("--state", str(state), "--outbox", str(outbox), "--results", str(results)),
            *("--listen", "127.0.0.1:0"),
        )
        try:
            url = serving.line_with("broker: web inbox on ").rsplit(" ", 1)[1]
            doc = {
                "version": 1,
                "id": "pr1",
                "effect": "github.pull_request.create",
                "params": {"repo": REPO, "head": "agent/fix", "base": "main", "title": "Fix x"},
            }
            (outbox / ".pr1.tmp").write_text(json.dumps(doc), encoding="utf-8")
            os.rename(outbox / ".pr1.tmp", outbox / "pr1.json")
            draft = eventually(lambda: hub.pulls(REPO))[0]
            card = eventually(lambda: hub.replies(REPO, draft["number"]))[0]
            sha256 = card.split("**Request sha256**: `", 1)[1][:64]
            eventually(lambda: hub.check_runs)
            said = hub.comment_as(
                "alice-gh", REPO, draft["number"], f"/broker approve {sha256[:16]}"
            )
            body, headers = delivery(SECRET, "issue_comment", comment_payload(REPO, said))
            assert (
                httpx.post(
                    f"{url}/github/webhook", content=body, headers=headers, verify=TLS
                ).status_code
                == 200
            )
            result = eventually(lambda: _result(results / "pr1.json"))
            assert result["status"] == "applied"
            run = next(iter(hub.check_runs.values()))
            eventually(lambda: run["history"] == ["queued", "success"])
            eventually(lambda: hub.thread(REPO, draft["number"])["state"] == "closed")
            assert serving.stop(signal.SIGTERM) == 0, serving.seen
        finally:
            serving.close()


def _result(path: Path) -> dict[str, object] | None:
    try:
        found: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return found if found.get("status") not in (None, "pending", "received") else None
