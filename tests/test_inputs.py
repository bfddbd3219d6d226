"""Where broker.toml, the state dir and the policy are (broker.inputs), as load_config
and `broker run`'s client both find them, and the digest a serving owner is matched on."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from broker.config import load_config
from broker.errors import ConfigError
from broker.inputs import digest, locate, sha256


def test_relative_paths_start_at_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('[broker]\nstate_dir = "state"\npolicy = "policy.toml"\n')
    located = locate(path)
    assert located.state_dir == tmp_path / "state"
    assert located.policy_path == tmp_path / "policy.toml"
    cfg = load_config(path)
    assert (cfg.state_dir, cfg.policy_path) == (located.state_dir, located.policy_path)


def test_options_win_over_the_file_and_broker_config_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('[broker]\nstate_dir = "state"\n')
    monkeypatch.setenv("BROKER_CONFIG", str(path))
    located = locate(None, tmp_path / "other", tmp_path / "p.toml")
    assert located.path == path
    assert located.state_dir == tmp_path / "other"
    assert located.policy_path == tmp_path / "p.toml"


def test_no_file_is_no_config_and_the_state_dir_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BROKER_CONFIG", raising=False)
    monkeypatch.setenv("BROKER_STATE_DIR", str(tmp_path / "st"))
    located = locate()
    assert located.path is None and located.data == {}
    assert located.state_dir == tmp_path / "st"


@pytest.mark.parametrize("text", ["[broker]\nstate_dir = 1\n", "[broker]\npolicy = []\n"])
def test_a_path_that_is_not_a_string_is_one_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="expected a path"):
        load_config(path)


def test_the_digest_follows_the_bytes_and_the_state_dir(tmp_path: Path) -> None:
    """The same inputs, the same digest; another byte or another state dir, another."""
    path = tmp_path / "broker.toml"
    policy = tmp_path / "policy.toml"
    policy.write_text("")
    path.write_text('[broker]\npolicy = "policy.toml"\n')

    def hashed(state: str) -> str:
        found = locate(path, tmp_path / state)
        return digest(found.state_dir, found.path, found.policy_path)

    first = hashed("a")
    assert hashed("a") == first
    assert hashed("b") != first
    policy.write_text("# changed\n")
    assert hashed("a") != first


@pytest.mark.parametrize("builtin", [True, False])
def test_sha256_is_sha256_with_or_without_the_builtin_module(
    monkeypatch: pytest.MonkeyPatch, builtin: bool
) -> None:
    """The digests a run remembers and labels images with are SHA-256 whichever module
    makes them: the interpreter's own, or OpenSSL's where a Python lacks it."""
    if not builtin:
        monkeypatch.setitem(
            sys.modules, "_sha2" if sys.version_info >= (3, 12) else "_sha256", None
        )
    data = b"broker.toml\0" * 1000
    made = sha256(data[:7])
    made.update(data[7:])
    assert made.hexdigest() == hashlib.sha256(data).hexdigest()
    if not builtin:
        assert type(made).__module__ == "_hashlib"  # OpenSSL's: the fallback was taken
