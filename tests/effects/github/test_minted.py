"""A GitHub App's token minted per call, for the request's repository and the effect's
permissions only, and revoked when the call ends (broker/credentials/github_app.py).

Stand-in: the fake, which issues installation tokens narrowed as asked and enforces
them (a token for acme/api is refused on acme/other; one without `issues` is refused
on the issues API), and records revocations; Prism for the exchange's request bodies.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from broker.errors import CredentialRefused, EffectFailed
from broker.grants import Scope, counts
from effects.github import APP_REVOKE_CALL, APP_TOKEN_CALL, IssueCreate, PullRequestCreate
from effects.github.settings import scope_for
from tests.effects.github.fake import Minted, seed_repo
from tests.effects.github.prism import RecordingProxy
from tests.effects.github.support import REPO, SEED, Hub, app_key, pr

APP, INSTALLATION = 4242, 77


@pytest.fixture
def app(tmp_path: Path, hub: Hub) -> dict[str, dict[str, Any]]:
    """The fake accepts the test App; `[credentials.acme-app]` names it."""
    key_file, public = app_key(tmp_path)
    hub.fake.app = (APP, public, INSTALLATION)
    other = tmp_path / "other.git"
    seed_repo(other, SEED)
    hub.fake.add_repo("acme/other", other)
    table = {"kind": "github_app", "app_id": APP, "installation_id": INSTALLATION}
    return {"acme-app": {**table, "private_key_file": str(key_file)}}


def minted_ctx(hub: Hub, app: dict[str, dict[str, Any]], request_id: str = "r1") -> Any:
    return hub.ctx(request_id, credentials=app, token_env=None, credential="acme-app")


def test_an_issue_gets_a_token_for_its_repository_and_issues_only(
    hub: Hub, app: dict[str, dict[str, Any]]
) -> None:
    """Fake: the exchange names the repository and `issues: write`; the token is revoked."""
    ctx = minted_ctx(hub, app)
    out = IssueCreate().apply({"repo": REPO, "title": "minted"}, ctx)
    used = ctx.grants.close()
    assert out["number"] == 1
    (mint,) = hub.fake.called(*APP_TOKEN_CALL)
    assert mint.body == {
        "repositories": ["api"],
        "permissions": {"issues": "write", "metadata": "read"},
    }
    token = hub.fake.called("POST", "/repos/{owner}/{repo}/issues")[0].auth.split()[-1]
    assert token.startswith("ghs_") and hub.fake.revoked == [token]
    assert hub.fake.installation_tokens == {}
    assert used == [
        {
            "scope": "github: acme/api only; issues:write, metadata:read",
            "provider": "github_app:acme-app",
            "id": used[0]["id"],
            "minted_at": used[0]["minted_at"],
            "expires_at": used[0]["expires_at"],
            "lifetime": "60 min",  # what GitHub gives an installation token
            "revoked": True,
        }
    ]
    assert used[0]["id"].startswith("sha256:") and token not in str(used)


def test_the_fake_refuses_a_minted_token_beyond_its_scope(
    hub: Hub, app: dict[str, dict[str, Any]]
) -> None:
    """Fake: a token for acme/api with contents:write is refused on acme/other and on issues."""
    ctx = minted_ctx(hub, app)
    grant = ctx.credential(scope_for(REPO, ("contents:write",), ctx))
    assert grant is not None
    fake = hub.fake
    assert (
        fake.dispatch("GET", "/repos/acme/api/git/ref/heads%2Fmain", _auth(grant.token), b"")[0]
        == 200
    )
    assert (
        fake.dispatch("GET", "/repos/acme/other/git/ref/heads%2Fmain", _auth(grant.token), b"")[0]
        == 403
    )
    issue = b'{"title": "t"}'
    assert fake.dispatch("POST", "/repos/acme/api/issues", _auth(grant.token), issue)[0] == 403
    ctx.grants.close()
    assert (
        fake.dispatch("GET", "/repos/acme/api/git/ref/heads%2Fmain", _auth(grant.token), b"")[0]
        == 401
    )


def test_a_pull_request_reads_with_a_read_token_and_writes_with_its_own(
    hub: Hub, app: dict[str, dict[str, Any]]
) -> None:
    """Fake: the preview's token reads contents and pulls; apply's writes them, no issues."""
    hub.push("agent/fix", {"README.md": "changed\n"})
    ctx = minted_ctx(hub, app)
    PullRequestCreate().preview(pr(), ctx)
    ctx.grants.close()
    ctx = minted_ctx(hub, app)
    out = PullRequestCreate().apply(pr(), ctx)
    ctx.grants.close()
    assert out["number"] >= 1
    asked = [c.body["permissions"] for c in hub.fake.called(*APP_TOKEN_CALL)]
    assert asked == [
        {"contents": "read", "metadata": "read", "pull_requests": "read"},
        {"contents": "write", "metadata": "read", "pull_requests": "write"},
    ]
    assert len(hub.fake.revoked) == 2 and hub.fake.installation_tokens == {}


def test_an_app_not_installed_on_the_repository_fails_closed(
    hub: Hub, app: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fake: the exchange is refused (422); nothing is applied, the standing token unused."""
    from tests.effects.github.support import TOKEN, TOKEN_ENV

    monkeypatch.setenv(TOKEN_ENV, TOKEN)  # a standing token on the host is never a fallback
    ctx = minted_ctx(hub, app)
    refused_before = counts["refused"]
    with pytest.raises(CredentialRefused, match=r"cannot reach acme/missing.*nothing was applied"):
        IssueCreate().apply({"repo": "acme/missing", "title": "t"}, ctx)
    assert counts["refused"] == refused_before + 1
    assert hub.fake.called("POST", "/repos/{owner}/{repo}/issues") == []
    assert all(c.auth != f"token {TOKEN}" for c in hub.fake.calls)


def test_a_refused_revocation_is_logged_and_counted(
    hub: Hub, app: dict[str, dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    """Fake: DELETE /installation/token answers 500: the apply stands, the fault is told."""
    hub.fake.fault(*APP_REVOKE_CALL, 500)
    ctx = minted_ctx(hub, app)
    IssueCreate().apply({"repo": REPO, "title": "t"}, ctx)
    before = counts["unrevoked"]
    with caplog.at_level(logging.WARNING, logger="broker.grants"):
        used = ctx.grants.close()
    assert used[0]["revoked"] is False and counts["unrevoked"] == before + 1
    assert "could not revoke the credential sha256:" in caplog.text
    token = hub.fake.called("POST", "/repos/{owner}/{repo}/issues")[0].auth.split()[-1]
    assert token not in caplog.text


def test_a_slow_exchange_hits_the_providers_deadline(
    hub: Hub, app: dict[str, dict[str, Any]]
) -> None:
    """Fake: the exchange answers after 1.5 s; with timeout = 1 the apply fails, unapplied."""
    app["acme-app"]["timeout"] = 1
    hub.fake.fault(*APP_TOKEN_CALL, 201, delay=1.5)
    ctx = minted_ctx(hub, app)
    with pytest.raises(CredentialRefused, match="within 1 s; nothing was applied"):
        IssueCreate().apply({"repo": REPO, "title": "t"}, ctx)
    assert hub.fake.called("POST", "/repos/{owner}/{repo}/issues") == []


def test_an_answer_wider_than_asked_is_revoked_and_refused(
    hub: Hub, app: dict[str, dict[str, Any]]
) -> None:
    """Fake: GitHub answering with every repository is not used; its token is revoked."""
    token = "ghs_" + "w" * 32
    hub.fake.installation_tokens[token] = Minted(None, {"issues": "write"})
    body = {"token": token, "expires_at": None, "repository_selection": "all", "permissions": {}}
    hub.fake.fault(*APP_TOKEN_CALL, 201, body)
    ctx = minted_ctx(hub, app)
    with pytest.raises(CredentialRefused, match=r"did not narrow.*every repository"):
        IssueCreate().apply({"repo": REPO, "title": "t"}, ctx)
    assert hub.fake.revoked == [token]


def test_the_legacy_app_keys_mint_narrowed_tokens_too(tmp_path: Path, hub: Hub) -> None:
    """Fake: app_id etc. in [integrations.github] go through the same provider."""
    key_file, public = app_key(tmp_path)
    hub.fake.app = (APP, public, INSTALLATION)
    keys = {"app_id": APP, "private_key_file": str(key_file), "installation_id": INSTALLATION}
    ctx = hub.ctx(token_env=None, **keys)
    IssueCreate().apply({"repo": REPO, "title": "t"}, ctx)
    assert hub.fake.called(*APP_TOKEN_CALL)[0].body["repositories"] == ["api"]
    ctx.grants.close()
    assert len(hub.fake.revoked) == 1


def test_a_static_token_is_a_standing_credential(hub: Hub) -> None:
    """Fake: without a provider nothing is minted; the host's token is used as before."""
    ctx = hub.ctx()
    assert ctx.credential(Scope("github", (REPO,), ("issues:write",))) is None
    IssueCreate().apply({"repo": REPO, "title": "t"}, ctx)
    assert ctx.grants.close() == [] and hub.fake.called(*APP_TOKEN_CALL) == []


def test_prism_accepts_the_exchange_and_the_revocation(
    prism: RecordingProxy, tmp_path: Path
) -> None:
    """Prism: the narrowed exchange and the revocation match GitHub's description. Prism's
    example answer reaches more than was asked, so the provider revokes it and refuses."""
    from broker.testing import make_context

    key_file, _ = app_key(tmp_path)
    table = {"kind": "github_app", "app_id": APP, "installation_id": INSTALLATION}
    ctx = make_context(
        {"base_url": prism.url, "credential": "acme-app"},
        integration="github",
        state_dir=tmp_path,
        credentials={"acme-app": {**table, "private_key_file": str(key_file)}},
    )
    prism.take()
    with pytest.raises(EffectFailed, match="did not narrow"):
        IssueCreate().apply({"repo": REPO, "title": "t"}, ctx)
    exchanges = prism.take()
    assert [(e.method, e.path) for e in exchanges] == [
        ("POST", f"/app/installations/{INSTALLATION}/access_tokens"),
        ("DELETE", "/installation/token"),
    ]
    for ex in exchanges:
        assert 200 <= ex.status < 300, f"{ex.method} {ex.path} → {ex.status}"
        assert [e for e in ex.errors if e.startswith("request")] == []


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"token {token}"}
