"""[integrations.github] and its credentials: a token, or a GitHub App."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.errors import ConfigError, EffectFailed, InvalidParams
from broker.settings import Settings
from broker.testing import make_context
from effects.github import APP_TOKEN_CALL, IssueCreate
from effects.github import settings as gh
from tests.effects.github.support import REPO, TOKEN, TOKEN_ENV, Hub, app_key

# -- configuration ------------------------------------------------------------------------


class TestConfig:
    def test_token_and_app_settings_are_accepted(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A token reference, or the three App keys, make a valid [integrations.github]."""
        monkeypatch.setenv(TOKEN_ENV, TOKEN)
        gh.check_settings({"token_env": TOKEN_ENV, "repos": ["acme/*"], "allow_mentions": True})
        gh.check_settings({"app_id": 1, "private_key_file": "k.pem", "installation_id": 2})

    @pytest.mark.parametrize(
        ("settings", "key"),
        [
            ({"tokn_env": "X"}, "tokn_env"),
            ({"base_url": "http://github.example.com/api/v3"}, "base_url"),
            ({"base_url": "ftp://x"}, "base_url"),
            ({"repos": "acme/*"}, "repos"),
            ({"repos": ["acme"]}, "repos"),
            ({"allow_mentions": "no"}, "allow_mentions"),
            ({"timeout": 0}, "timeout"),
            ({"token_env": "UNSET_BROKER_TEST_VAR"}, "token_env"),
            ({"token_env": TOKEN_ENV, "app_id": 1}, "app_id"),
            ({"app_id": 1, "installation_id": 2}, "private_key_file"),
            ({"app_id": "1", "private_key_file": "k", "installation_id": 2}, "app_id"),
        ],
    )
    def test_broken_settings_name_the_key(
        self, settings: dict[str, Any], key: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Each broken setting stops the broker with a message naming its key."""
        monkeypatch.setenv(TOKEN_ENV, TOKEN)
        with pytest.raises(ConfigError, match=rf"integrations\.github\.{key}"):
            gh.check_settings(settings)

    def test_plain_http_is_allowed_for_loopback_only(self) -> None:
        """http:// is refused unless the host is 127.0.0.1, ::1 or localhost."""
        for url in ("http://127.0.0.1:9", "http://localhost:9", "http://[::1]:9"):
            gh.check_settings({"base_url": url})

    def test_missing_credentials_fail_with_a_sentence(self, hub: Hub) -> None:
        """Stand-in: the fake. Without any credential the effect fails, naming the keys."""
        with pytest.raises(EffectFailed, match="not configured on this host"):
            IssueCreate().apply({"repo": REPO, "title": "t"}, hub.ctx(token_env=None))

    def test_repo_outside_the_allowlist_is_invalid(self, hub: Hub) -> None:
        """Stand-in: none (refused before any call). repos = ['acme/*'] allows no other."""
        with pytest.raises(InvalidParams, match="not among the repositories"):
            IssueCreate().check({"repo": "other/api", "title": "t"}, hub.ctx())
        IssueCreate().check({"repo": "ACME/Api", "title": "t"}, hub.ctx())
        with pytest.raises(InvalidParams, match="not owner/name"):
            IssueCreate().check({"repo": "acme/..", "title": "t"}, hub.ctx())
        assert hub.fake.calls == []


def test_github_app_credentials_get_an_installation_token(tmp_path: Path, hub: Hub) -> None:
    """Stand-in: the fake (it checks the App's JWT with the public key, then the token)."""
    key_file, public = app_key(tmp_path)
    hub.fake.app = (4242, public, 77)
    settings: dict[str, Any] = {
        "app_id": 4242,
        "private_key_file": str(key_file),
        "installation_id": 77,
    }
    ctx = hub.ctx(token_env=None, repos=None, **settings)
    out = IssueCreate().apply({"repo": REPO, "title": "from the app"}, ctx)
    assert out["number"] == 1
    token_calls = hub.fake.called("POST", APP_TOKEN_CALL[1])
    assert [c.status for c in token_calls] == [201]
    assert hub.fake.called("POST", "/repos/{owner}/{repo}/issues")[0].auth.startswith("token ghs_")
    key_file.write_text("not a key")
    with pytest.raises(EffectFailed, match="private key cannot sign"):
        IssueCreate().apply(
            {"repo": REPO, "title": "t"}, hub.ctx("r2", token_env=None, repos=None, **settings)
        )


def test_relative_token_file_is_read_beside_broker_toml(
    tmp_path: Path, hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-in: the fake (it accepts only the real token). token_file = "gh-token" is
    read from broker.toml's folder, not from the current one (which holds a decoy)."""
    etc, elsewhere = tmp_path / "etc", tmp_path / "elsewhere"
    etc.mkdir()
    elsewhere.mkdir()
    (etc / "gh-token").write_text(f"{TOKEN}\n")
    (elsewhere / "gh-token").write_text("ghp_decoy_from_the_current_directory\n")
    monkeypatch.chdir(elsewhere)
    settings = {"token_file": "gh-token", "base_url": hub.fake.url, "repos": ["acme/*"]}
    IssueCreate().check_config(Settings(settings, "integrations.github", etc))
    ctx = make_context(settings, integration="github", config_dir=etc, state_dir=hub.state)
    out = IssueCreate().apply({"repo": REPO, "title": "with the token from etc"}, ctx)
    assert out["number"] == 1
    assert hub.fake.called("POST", "/repos/{owner}/{repo}/issues")[0].auth == f"token {TOKEN}"
