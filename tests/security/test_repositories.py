"""Issue 24 finding 7: protected paths belong to the repository. One setting per
repository (`[repositories.NAME]`) is read by git.push and by a pull request from
`files`; the default set protects CI workflows and actions until a repository opts
out; the older per-integration keys protect every repository, not one effect's."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from broker.config import Config, load_config
from broker.errors import ConfigError
from broker.repositories import DEFAULT_PROTECTED
from broker.testing import make_context
from effects.github.pulls import PullRequestCreate


def pr(*paths: str, repo: str = "acme/api") -> dict[str, Any]:
    files = [{"path": p, "content": "x"} for p in paths]
    return {"repo": repo, "head": "agent/x", "base": "main", "title": "t", "files": files}


def touched(config: Config, params: dict[str, Any]) -> list[str]:
    ctx = make_context(dict(config.integrations.get("github", {})), integration="github")
    ctx = dataclasses.replace(ctx, repositories=config.repositories)
    return list(PullRequestCreate().protected_for(params, ctx))


def config(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "broker.toml"
    path.write_text(f'[broker]\nstate_dir = "{tmp_path / "state"}"\n{text}')
    return load_config(path)


def test_the_git_key_protects_a_pull_request_too(tmp_path: Path) -> None:
    """The issue's case: `[integrations.git] protected_paths` set, a PR from `files`
    touching it reports the path (so it waits for a person whatever the rules say)."""
    cfg = config(tmp_path, '[integrations.git]\nprotected_paths = ["deploy/*"]\n')
    assert touched(cfg, pr("deploy/prod.sh", "src/a.py")) == ["deploy/prod.sh"]
    assert cfg.repositories.for_remote("origin") == (*DEFAULT_PROTECTED, "deploy/*")


def test_workflows_and_actions_are_protected_by_default(tmp_path: Path) -> None:
    """No protected_paths anywhere: .github/workflows/** and .github/actions/** are."""
    cfg = config(tmp_path, "")
    found = touched(cfg, pr(".github/workflows/ci.yml", ".github/actions/x/action.yml", "a.py"))
    assert found == [".github/workflows/ci.yml", ".github/actions/x/action.yml"]
    assert cfg.repositories.for_remote("origin") == DEFAULT_PROTECTED


def test_one_repository_setting_for_its_remote_and_its_github_name(tmp_path: Path) -> None:
    """[repositories.api] names both; its set replaces the default for both, and
    another repository keeps the default. `protected_paths = []` opts out."""
    cfg = config(
        tmp_path,
        '[repositories.api]\ngithub = "Acme/API"\ngit_remotes = ["origin"]\n'
        'protected_paths = ["infra/**"]\n'
        '[repositories.docs]\ngithub = "acme/docs"\nprotected_paths = []\n',
    )
    assert cfg.repositories.for_remote("origin") == ("infra/**",)
    assert touched(cfg, pr("infra/main.tf", ".github/workflows/ci.yml")) == ["infra/main.tf"]
    assert touched(cfg, pr(".github/workflows/ci.yml", repo="acme/docs")) == []
    assert touched(cfg, pr(".github/workflows/ci.yml", repo="acme/web")) == [
        ".github/workflows/ci.yml"
    ]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[repositories.api]\ngithub = "acme"\n', "repositories.api.github"),
        ("[repositories.api]\nprotected_paths = []\n", "repositories.api"),
        ('[repositories.api]\ngithub = "a/b"\nprotected = []\n', "repositories.api.protected"),
        ('[repositories.a]\ngithub = "a/b"\n[repositories.b]\ngithub = "A/B"\n', "repositories.b"),
    ],
)
def test_a_bad_repository_table_stops_the_start(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config(tmp_path, text)
