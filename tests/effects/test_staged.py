"""Staged mode applies nothing, for every built-in effect, checked at the real targets:
the export root, a real git remote, the fake GitHub (a recording server over a real
bare repository), moto's S3 server, a local HTTP server (http.request and webhook.post)
and aiosmtpd (email.send). One broker serves them all, as a team trying a policy would."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pytest_httpserver import HTTPServer

from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness
from effects.github import IssueCreate, PullRequestCreate
from tests.effects.conftest import S3_PLAIN, S3_VERSIONED
from tests.effects.github.fake import FakeGitHub, seed_repo
from tests.effects.github.support import REPO, SEED, TOKEN, TOKEN_ENV, Hub, pr
from tests.effects.netfixtures import (  # noqa: F401  (fixtures, used by their names)
    SMTP,
    fixture_loopback_only,
    fixture_smtp_plain,
    fixture_web,
    fixture_web_server,
)
from tests.effects.test_git import ENV, git
from tests.support import checked

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

POLICY = """
[[rules]]
effect = "git.push"
when = { branch = "agent/*" }
action = "auto"
reason = "agent branches are scratch space"

[[rules]]
effect = "http.request"
action = "auto"
reason = "the crm sandbox account may be written"

[[rules]]
effect = "webhook.post"
action = "auto"
reason = "deploy notices are harmless"

[[rules]]
effect = "email.send"
action = "deny"
reason = "no mail leaves while we try this integration"
"""

NO_PREVIEW = "the preview could not be computed"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """The fake GitHub serving acme/api, with an issue, a pull request and a branch for
    a second one. Module-scoped: it starts before the loopback guard (http.server looks
    its own name up as it binds)."""
    base = tmp_path_factory.mktemp("github")
    remote = base / "api.git"
    seed_repo(remote, SEED)
    state = base / "state"
    state.mkdir()
    with pytest.MonkeyPatch.context() as env, FakeGitHub(token=TOKEN) as fake:
        env.setenv(TOKEN_ENV, TOKEN)
        fake.add_repo(REPO, remote)
        settings = {"token_env": TOKEN_ENV, "base_url": fake.url, "repos": ["acme/*"]}
        hub = Hub(fake, remote, state, settings)
        hub.push("agent/fix", {"src/app.py": "x = 2\n"})
        hub.push("agent/two", {"docs/guide.md": "# Guide, two\n"})
        IssueCreate().apply({"repo": REPO, "title": "an issue"}, hub.ctx("setup-1"))
        PullRequestCreate().apply(pr(), hub.ctx("setup-2"))
        yield hub


def refs(remote: Path) -> str:
    return git(remote, "for-each-ref", "--format=%(refname) %(objectname)")


def bundle_for(remote: Path, work: Path) -> bytes:
    """An agent's commit on top of main, as a git bundle."""
    subprocess.run(["git", "clone", "-q", str(remote), str(work)], check=True, env=ENV)
    (work / "src" / "app.py").write_text("x = 42\n")
    git(work, "commit", "-q", "-am", "the answer")
    out = work.parent / "fix.bundle"
    git(work, "bundle", "create", "-q", str(out), "origin/main..HEAD")
    return out.read_bytes()


def requests(web: HTTPServer) -> dict[str, dict[str, Any]]:
    """One request per built-in effect (with the verdict its policy gives it)."""
    return {
        "files.write": {"path": "report.txt", "content": "the report\n"},
        "git.push": {
            "remote": "origin",
            "branch": "agent/new",
            "bundle": "fix",
            "expected_old": None,
        },
        "github.issue.create": {"repo": REPO, "title": "Crash in the parser"},
        "github.issue.comment": {"repo": REPO, "number": 1, "body": "seen it too"},
        "github.label.add": {"repo": REPO, "number": 1, "labels": ["bug"]},
        "github.pull_request.create": pr(head="agent/two", title="Second"),
        "github.pull_request.comment": {"repo": REPO, "number": 2, "body": "LGTM"},
        "s3.put_object": {"bucket": S3_PLAIN, "key": "new.txt", "body": "agent bytes"},
        "s3.copy_object": {
            "bucket": S3_PLAIN,
            "key": "copy.txt",
            "source_bucket": S3_VERSIONED,
            "source_key": "old.txt",
        },
        "s3.delete_object": {"bucket": S3_PLAIN, "key": "keep.txt"},
        "http.request": {
            "method": "POST",
            "destination": "crm",
            "path": "/v2/contacts",
            "json": {"n": 1},
        },
        "webhook.post": {"target": "deploy", "payload": {"text": "deployed"}},
        "email.send": {"to": ["ops@example.com"], "subject": "hello", "text": "body"},
        "code.execute": {"blocks": [{"language": "python", "code": "print(1)"}]},
    }


VERDICTS = {
    "files.write": ("auto", "default"),
    "git.push": ("auto", "rules[0]"),
    "s3.put_object": ("auto", "default"),
    "s3.copy_object": ("auto", "default"),
    "http.request": ("auto", "rules[1]"),
    "webhook.post": ("auto", "rules[2]"),
    "email.send": ("deny", "rules[3]"),
}  # the rest: approve by default (irreversible, no rule)


def test_staged_mode_applies_no_built_in_effect(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    hub: Hub,
    s3_settings: dict[str, Any],
    s3_client: S3Client,
    web: HTTPServer,
    smtp_plain: SMTP,
) -> None:
    """Every effect is staged with its verdict and a real preview, and no target changed:
    no file, the remote's refs as they were, no write call to GitHub, no S3 object
    written or removed, no HTTP request received, no mail."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    exports = tmp_path / "exports"
    exports.mkdir()
    s3_client.put_object(Bucket=S3_VERSIONED, Key="old.txt", Body=b"old")
    s3_client.put_object(Bucket=S3_PLAIN, Key="keep.txt", Body=b"keep")
    controller, inbox = smtp_plain
    integrations = {
        "files": {"root": str(exports)},
        "git": {"remotes": {"origin": {"url": str(hub.remote)}}, "protected_branches": ["main"]},
        "github": hub.settings,
        "s3": s3_settings,
        "http": {
            "allow_networks": ["127.0.0.0/8"],
            "destinations": {"crm": {"base_url": f"http://127.0.0.1:{web.port}/api"}},
        },
        "webhook": {
            "allow_networks": ["127.0.0.0/8"],
            "targets": {"deploy": {"url": f"http://127.0.0.1:{web.port}/hook", "retries": 0}},
        },
        "email": {
            "host": "127.0.0.1",
            "port": controller.port,
            "security": "none",
            "from": "Agent <agent@example.com>",
            "allow_domains": ["example.com"],
        },
    }
    bundle = bundle_for(hub.remote, tmp_path / "work")
    refs_before = refs(hub.remote)
    github_calls = len(hub.fake.calls)
    wanted = requests(web)
    h = BrokerHarness(tmp_path / "b", integrations=integrations, policy=POLICY, staged=True)
    assert sorted(wanted) == h.registry.names()  # every built-in effect, no more
    results: dict[str, dict[str, Any]] = {}
    with h:
        h.write("push.fix.bin", bundle)
        docs = {}
        for effect, params in wanted.items():
            extra = {"attachments": ["fix"]} if effect == "git.push" else {}
            doc = h.request(effect, params, **extra)
            if effect == "git.push":
                doc.pop("id")  # its id is its file's name, which its attachment's names
            docs[effect] = doc
            h.write(f"{'push' if effect == 'git.push' else doc['id']}.json", doc)
        for effect, doc in docs.items():
            rid = "push" if effect == "git.push" else doc["id"]
            results[effect] = h.wait(rid, timeout=30)

    for effect, result in results.items():
        checked(result)
        assert result["status"] == "staged", (effect, result)
        out = result["output"]
        action, rule = VERDICTS.get(effect, ("approve", "default"))
        assert (out["verdict"]["action"], out["verdict"]["rule"]) == (action, rule), effect
        assert out["preview"]["title"] and out["preview"]["title"] != NO_PREVIEW, (effect, out)
        assert TOKEN not in json.dumps(result)
    assert "the report" in results["files.write"]["output"]["preview"]["body"]
    assert "agent bytes" in results["s3.put_object"]["output"]["preview"]["body"]
    assert "LGTM" in results["github.pull_request.comment"]["output"]["preview"]["body"]

    assert list(exports.iterdir()) == []  # not even root/<sandbox>/ (issue 24)
    assert refs(hub.remote) == refs_before
    writes = [c for c in hub.fake.calls[github_calls:] if c.method != "GET"]
    assert writes == [], writes
    listed = s3_client.list_objects_v2(Bucket=S3_PLAIN).get("Contents", [])
    assert [o["Key"] for o in listed] == ["keep.txt"]  # nothing written, nothing deleted
    versions = s3_client.list_object_versions(Bucket=S3_VERSIONED)
    assert [v["Key"] for v in versions.get("Versions", [])] == ["old.txt"]
    assert versions.get("DeleteMarkers", []) == []
    assert web.log == []
    assert inbox.messages == []
    ledger = Ledger(h.config.ledger_path)
    try:
        assert {r.state for r in ledger.all()} == {"staged"}
    finally:
        ledger.close()
    events = {json.loads(line)["event"] for line in h.config.audit_path.read_text().splitlines()}
    assert "applying" not in events and "pending" not in events
