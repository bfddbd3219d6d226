"""git.push with a GitHub App token minted per call for the remote's repository alone
(`contents: write` to push, `contents: read` to preview), revoked after
(effects/gitcreds.py); the stand-in refuses the token beyond its scope.

Stand-ins, on 127.0.0.1: the fake GitHub (tests/effects/github/fake.py) issuing the
App's narrowed tokens, and its git smart HTTP (tests/effects/github/fake_git.py), which
runs real git in the fake's bare repositories and enforces each token's repositories
and `contents` level as GitHub does.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.credentials.github_app import GitHubApp
from broker.errors import ConfigError, CredentialRefused
from broker.settings import Settings
from broker.testing import BrokerHarness, make_context
from effects.base import Context, Scope
from effects.git import GitPush
from effects.github import APP_TOKEN_CALL
from tests.effects.github.fake import GIT_ENV, FakeGitHub, seed_repo
from tests.effects.github.fake_git import FakeGitHttp
from tests.effects.github.support import SEED, app_key

APP, INSTALLATION = 4242, 77


@dataclass
class Forge:
    """The fake GitHub with acme/api and acme/other, its git HTTP, and the agent's clone."""

    fake: FakeGitHub
    git_http: FakeGitHttp
    api: Path
    work: Path
    state: Path
    credentials: dict[str, dict[str, Any]]

    def settings(self, repo: str = "acme/api") -> dict[str, Any]:
        remote = {"url": f"{self.git_http.url}/{repo}.git", "api_url": self.fake.url}
        return {"remotes": {"origin": remote}, "credential": "acme-app"}

    def ctx(self, bundle: Path, repo: str = "acme/api", rid: str = "r1") -> Context:
        return make_context(
            self.settings(repo),
            integration="git",
            sandbox="sb",
            request_id=rid,
            request_sha256=hashlib.sha256(rid.encode()).hexdigest(),
            state_dir=self.state,
            attachments={"fix": bundle},
            credentials=self.credentials,
        )

    def bundle(self, path: str = "src/new.py") -> Path:
        (self.work / path).parent.mkdir(parents=True, exist_ok=True)
        (self.work / path).write_text("new = 1\n")
        run(self.work, "add", path)
        run(self.work, "commit", "-q", "-m", "add new")
        out = self.state / f"b-{path.replace('/', '-')}.bundle"
        run(self.work, "bundle", "create", "-q", str(out), "origin/main..HEAD")
        return out

    def head(self, branch: str) -> str:
        return run(self.api, "rev-parse", "--verify", "--quiet", branch, check=False)


def run(repo: Path, *args: str, check: bool = True) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], env=GIT_ENV, capture_output=True, text=True
    )
    if check and done.returncode != 0:
        raise AssertionError(done.stderr)
    return done.stdout.strip()


@pytest.fixture
def forge(tmp_path: Path) -> Iterator[Forge]:
    key_file, public = app_key(tmp_path)
    api, other = tmp_path / "api.git", tmp_path / "other.git"
    seed_repo(api, SEED)
    seed_repo(other, SEED)
    work, state = tmp_path / "work", tmp_path / "state"
    state.mkdir()
    subprocess.run(["git", "clone", "-q", str(api), str(work)], env=GIT_ENV, check=True)
    with FakeGitHub(token="standing-token-never-used", app=(APP, public, INSTALLATION)) as fake:
        fake.add_repo("acme/api", api)
        fake.add_repo("acme/other", other)
        git_http = FakeGitHttp(fake).start()
        table = {"kind": "github_app", "app_id": APP, "installation_id": INSTALLATION}
        credentials = {
            "acme-app": {**table, "private_key_file": str(key_file), "base_url": fake.url}
        }
        yield Forge(fake, git_http, api, work, state, credentials)
        git_http.stop()


def params(branch: str = "agent/fix") -> dict[str, Any]:
    return {"remote": "origin", "branch": branch, "bundle": "fix", "expected_old": None}


def test_a_push_gets_a_token_for_its_repository_and_contents_write_only(forge: Forge) -> None:
    """Fake + git HTTP: the exchange names acme/api and contents: write; pushed; revoked."""
    bundle = forge.bundle()
    ctx = forge.ctx(bundle)
    out = GitPush().apply(params(), ctx)
    assert ctx.grants is not None
    (used,) = ctx.grants.close()
    assert out["pushed"] is True and forge.head("agent/fix") == out["new"]
    (mint,) = forge.fake.called(*APP_TOKEN_CALL)
    assert mint.body == {
        "repositories": ["api"],
        "permissions": {"contents": "write", "metadata": "read"},
    }
    assert used["scope"] == "github: acme/api only; contents:write, metadata:read"
    assert used["revoked"] is True and used["lifetime"] == "60 min"
    (token,) = forge.fake.revoked
    assert {(s.repo, s.token) for s in forge.git_http.pushes()} == {("acme/api", token[-6:])}
    assert forge.fake.installation_tokens == {}  # revoked: the fake no longer knows it


def test_a_preview_fetches_with_a_read_token_that_cannot_push(forge: Forge) -> None:
    """Fake + git HTTP: the preview's token says contents: read; the stand-in refuses it a push."""
    bundle = forge.bundle()
    ctx = forge.ctx(bundle)
    preview = GitPush().preview(params(), ctx)
    assert "src/new.py" in preview.body
    (mint,) = forge.fake.called(*APP_TOKEN_CALL)
    assert mint.body["permissions"] == {"contents": "read", "metadata": "read"}
    read = Scope("github", ("acme/api",), ("contents:read", "metadata:read"), forge.fake.url)
    grant = ctx.credential(read)  # the preview's own (one grant per scope per call)
    assert grant is not None and len(forge.fake.called(*APP_TOKEN_CALL)) == 1
    refused = push_with(forge, grant.token, "acme/api")
    assert "403" in refused
    assert ctx.grants is not None
    ctx.grants.close()
    assert forge.head("agent/fix") == ""


def test_the_stand_in_refuses_a_write_token_on_another_repository_and_the_issues_api(
    forge: Forge,
) -> None:
    """Fake + git HTTP: acme/api's contents-write token is refused on acme/other and on issues."""
    provider = GitHubApp(Settings(forge.credentials["acme-app"], "credentials.acme-app"))
    scope = Scope("github", ("acme/api",), ("contents:write", "metadata:read"))
    grant = provider.mint(scope, "sb/r9 abc")
    try:
        assert "403" in push_with(forge, grant.token, "acme/other")
        issue = httpx.post(
            f"{forge.fake.url}/repos/acme/api/issues",
            json={"title": "x"},
            headers={"Authorization": f"token {grant.token}"},
        )
        assert issue.status_code == 403
        assert push_with(forge, grant.token, "acme/api") == ""
    finally:
        provider.revoke(grant)


def test_an_app_not_installed_on_the_repository_fails_the_push_closed(forge: Forge) -> None:
    """Fake: the App cannot reach acme/missing: failed, saying so; nothing fetched or pushed."""
    bundle = forge.bundle()
    with pytest.raises(CredentialRefused, match="cannot reach acme/missing") as refused:
        GitPush().apply(params(), forge.ctx(bundle, repo="acme/missing"))
    assert "nothing was applied" in refused.value.reason
    assert forge.git_http.served == []


def test_a_standing_token_beside_a_provider_is_refused_at_start(forge: Forge) -> None:
    """No server needed: `credential` and a remote's token_env together stop the start."""
    settings = forge.settings()
    settings["remotes"]["origin"]["token_env"] = "SOME_TOKEN"
    with pytest.raises(ConfigError, match=r"origin\.token_env: .* remove the standing token"):
        GitPush().check_config(settings)


def test_through_the_broker_the_push_records_its_scope(forge: Forge, tmp_path: Path) -> None:
    """Fake + git HTTP + a real broker: applied; the result names the scope, not the token."""
    bundle = forge.bundle()
    policy = '[[rules]]\neffect = "git.push"\naction = "auto"\nreason = "test"\n'
    h = BrokerHarness(
        tmp_path / "h",
        integrations={"git": forge.settings()},
        credentials=forge.credentials,
        policy=policy,
    )
    with h:
        h.write("p1.fix.bin", bundle.read_bytes())
        doc = {"version": 1, "effect": "git.push", "params": params(), "attachments": ["fix"]}
        result = h.submit(doc, name="p1", timeout=30)
    assert result["status"] == "applied", result
    (used,) = result["output"]["credential"]
    assert used["scope"] == "github: acme/api only; contents:write, metadata:read"
    token = forge.fake.revoked[-1]
    for path in [*h.results.glob("*.json"), *h.state.rglob("*"), h.config.audit_path]:
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path


def push_with(forge: Forge, token: str, repo: str) -> str:
    """Push the clone's HEAD to `repo` with `token` as git.push sends it: '' or git's error."""
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    done = subprocess.run(
        [
            "git",
            "-C",
            str(forge.work),
            "-c",
            f"http.extraHeader=Authorization: Basic {basic}",
            "push",
            "-q",
            f"{forge.git_http.url}/{repo}.git",
            "HEAD:refs/heads/probe",
        ],
        env={**GIT_ENV, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/false"},
        capture_output=True,
        text=True,
    )
    return "" if done.returncode == 0 else done.stderr
