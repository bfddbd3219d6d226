"""GitHub approval threads wherever a broker serves requests, not only under `broker
serve`: the broker `broker run` hosts for its sandbox (broker.hosting.serving, with the
`on_broker` hook `broker run` passes) and the one an embedded executor runs
(broker.integrations.embedded) open the draft and its
card, read a `/broker approve` comment by polling (no web server here), apply, and
complete the check run and delete the staging branch when they stop."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.config import Config, load_config
from broker.hosting.serving import Serving
from broker.integrations import embedded
from broker.integrations.github_cards import on_broker
from broker.policy.ruleset import load_policy
from broker.registry import default_registry
from tests.effects.github.fake import commit_on, git, seed_repo
from tests.effects.github.fake_reviews import ReviewingGitHub
from tests.effects.github.support import REPO, SEED, TOKEN, TOKEN_ENV
from tests.support import eventually

POLICY = """
[[rules]]
effect = "github.pull_request.create"
action = "approve"
reason = "a person reviews every pull request the agent opens"
"""


def hosted_by_run(config: Config) -> Callable[[], None]:
    registry = default_registry()
    registry.check_config(config.integrations, config.base_dir)
    policy = load_policy(config.policy_path, registry.reversibility(), registry.schemas())
    serving = Serving(config, lambda: (registry, policy), "sb1", on_broker=on_broker(config))
    serving.start()
    assert serving.owner
    return serving.finish


def hosted_embedded(config: Config) -> Callable[[], None]:
    served = embedded.serve(config, "sb1")
    assert served.own_broker
    return served.close


@pytest.mark.parametrize("host", [hosted_by_run, hosted_embedded], ids=["run", "embedded"])
def test_threads_under_any_hosting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: Callable[[Config], Callable[[], None]]
) -> None:
    """The draft, its card and a queued check appear; alice's comment applies the
    request; the check succeeds and the staging branch is gone once the broker stops."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    remote = tmp_path / "api.git"
    seed_repo(remote, SEED)
    commit_on(remote, "agent/fix", {"src/app.py": b"x = 2\n"}, start="main")
    state = tmp_path / "state"
    box = state / "sandboxes" / "sb1"
    with ReviewingGitHub(token=TOKEN) as hub:
        hub.add_repo(REPO, remote)
        hub.private.add(REPO)
        hub.permissions[(REPO, "alice-gh")] = "write"
        (tmp_path / "policy.toml").write_text(POLICY, encoding="utf-8")
        (tmp_path / "broker.toml").write_text(
            f"""
[broker]
state_dir = "{state}"

[integrations.github]
token_env = "{TOKEN_ENV}"
base_url = "{hub.url}"
repos = ["acme/*"]
approve_in_pr = true
poll_interval = "1s"

[approvers.alice]
github_user = "alice-gh"
""",
            encoding="utf-8",
        )
        (box / "outbox").mkdir(parents=True)
        config = load_config(tmp_path / "broker.toml", policy=tmp_path / "policy.toml")
        stop = host(config)
        try:
            doc = {
                "version": 1,
                "id": "pr1",
                "effect": "github.pull_request.create",
                "params": {"repo": REPO, "head": "agent/fix", "base": "main", "title": "Fix"},
            }
            (box / "outbox" / ".pr1.tmp").write_text(json.dumps(doc), encoding="utf-8")
            os.rename(box / "outbox" / ".pr1.tmp", box / "outbox" / "pr1.json")
            draft = eventually(lambda: hub.pulls(REPO))[0]
            card = eventually(lambda: hub.replies(REPO, draft["number"]))[0]
            sha256 = card.split("**Request sha256**: `", 1)[1][:64]
            run = eventually(lambda: next(iter(hub.check_runs.values()), None))
            hub.comment_as("alice-gh", REPO, draft["number"], f"/broker approve {sha256[:16]}")
            eventually(lambda: _status(box / "results" / "pr1.json") == "applied", 30)
            eventually(lambda: run["history"] == ["queued", "success"])
        finally:
            stop()
        refs = git(remote, "for-each-ref", "--format=%(refname:short)").split()
        assert "broker/pending/pr1" not in refs
        assert any(r.startswith("**Applied**") for r in hub.replies(REPO, draft["number"]))


def _status(path: Path) -> str | None:
    try:
        return str(json.loads(path.read_text(encoding="utf-8")).get("status"))
    except (FileNotFoundError, ValueError):
        return None
