"""What a remembered check is keyed on (broker.cli.passed): everything the check reads
that can change without a new broker, and nothing that does not matter to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cli import passed
from broker.config import Config, load_config


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """broker.toml naming a policy, an environment variable and a file."""
    monkeypatch.setenv("HOOK_URL", "http://127.0.0.1:9/hook/one")
    (tmp_path / "policy.toml").write_text('[[rules]]\neffect = "*"\naction = "auto"\n')
    (tmp_path / "key.pem").write_text("one")
    path = tmp_path / "broker.toml"
    path.write_text(
        '[broker]\nstate_dir = "state"\npolicy = "policy.toml"\n'
        '[integrations.webhook.hooks.a]\nurl_env = "HOOK_URL"\nsigning_key_file = "key.pem"\n'
    )
    return path


def key(config: Path) -> str:
    return passed.key(load_config(config))


def test_the_key_is_the_same_for_the_same_inputs(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing changed: the same key (and another variable changing does not matter)."""
    before = key(config)
    monkeypatch.setenv("SOMETHING_ELSE", "x")
    assert key(config) == before


@pytest.mark.parametrize(
    "change",
    [
        "config",
        "policy",
        "env",
        "env unset",
        "file",
    ],
)
def test_the_key_changes_with_what_the_check_reads(
    config: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """broker.toml's or the policy's bytes, a variable or a file the config names."""
    before = key(config)
    if change == "config":
        config.write_text(config.read_text() + "# a comment\n")
    elif change == "policy":
        (config.parent / "policy.toml").write_text('[[rules]]\neffect = "*"\naction = "deny"\n')
    elif change == "env":
        monkeypatch.setenv("HOOK_URL", "http://127.0.0.1:9/hook/two")
    elif change == "env unset":
        monkeypatch.delenv("HOOK_URL")
    else:
        (config.parent / "key.pem").unlink()
    assert key(config) != before


def test_remembered_inputs_give_back_their_warnings_and_can_be_forgotten(
    config: Path,
) -> None:
    cfg = load_config(config)
    assert passed.passed_before(cfg) is None
    passed.remember(cfg, ["policy.toml: rule 2 never decides"])
    assert passed.passed_before(cfg) == ["policy.toml: rule 2 never decides"]
    passed.forget(cfg)
    assert passed.passed_before(cfg) is None


def test_only_the_newest_keys_are_kept(tmp_path: Path) -> None:
    """Several configs on one state dir: the oldest fall out past KEEP."""
    configs = []
    for i in range(passed.KEEP + 2):
        path = tmp_path / f"broker{i}.toml"
        path.write_text(f'[broker]\nstate_dir = "state"\n# {i}\n')
        configs.append(load_config(path))
        passed.remember(configs[-1], [])
    assert passed.passed_before(configs[0]) is None
    assert passed.passed_before(configs[-1]) == []
    assert passed.passed_before(configs[2]) == []


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"k": "not a list"}'])
def test_a_broken_record_means_checking_again(tmp_path: Path, content: str) -> None:
    cfg = Config(state_dir=tmp_path / "state")
    cfg.state_dir.mkdir()
    (cfg.state_dir / passed.FILE).write_text(content)
    assert passed.passed_before(cfg) is None
    passed.remember(cfg, [])  # and it is written anew
    assert passed.passed_before(cfg) == []


def test_a_link_in_place_of_the_record_is_not_followed(tmp_path: Path) -> None:
    """The record is read and replaced, never read or written through a symlink."""
    cfg = Config(state_dir=tmp_path / "state")
    cfg.state_dir.mkdir()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    (cfg.state_dir / passed.FILE).symlink_to(elsewhere)
    passed.remember(cfg, [])
    assert elsewhere.read_text() == "{}"
    assert not (cfg.state_dir / passed.FILE).is_symlink()
    assert passed.passed_before(cfg) == []
