"""broker.toml: where it is found, what it may hold, how secrets are referenced."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import load_config
from broker.errors import ConfigError
from broker.settings import Settings


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No $BROKER_CONFIG or state-dir variables from the outside; HOME is a temp dir."""
    for name in ("BROKER_CONFIG", "BROKER_STATE_DIR", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def write_config(folder: Path, text: str) -> Path:
    """broker.toml with `text` in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "broker.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("integrations.github", "token"),
        ("integrations.github", "TOKEN"),
        ("integrations.github", "github_token"),
        ("integrations.smtp", "password"),
        ("integrations.smtp", "passwd"),
        ("integrations.s3", "secret"),
        ("integrations.s3", "client_secret"),
        ("integrations.openai", "api_key"),
        ("integrations.ssh", "private_key"),
        ("integrations.github.app", "private_key"),
    ],
)
def test_literal_secret_is_refused(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, section: str, key: str
) -> None:
    """A secret written as a value is refused, naming the key and the _env/_file forms."""
    path = write_config(tmp_path, f'[{section}]\n{key} = "abc123"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"{section}.{key}" in message
    assert f"{key}_env" in message and f"{key}_file" in message
    assert "abc123" not in message


@pytest.mark.parametrize(
    ("section", "line"),
    [
        pytest.param(
            "integrations.s3", 'secret_access_key = "wJalrXUtnFEMI/K7MDENG"', id="secret_access_key"
        ),
        pytest.param(
            "integrations.s3",
            'aws_secret_access_key = "wJalrXUtnFEMI/K7MDENG"',
            id="aws_secret_access_key",
        ),
        pytest.param("integrations.github", "token = 123456789", id="numeric-token"),
    ],
)
def test_other_literal_secrets_are_refused(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, section: str, line: str
) -> None:
    """AWS-style secret access keys and secrets written as numbers are refused too."""
    path = write_config(tmp_path, f"[{section}]\n{line}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{section}.{line.split(' ')[0]}" in str(info.value)


def test_env_reference_is_resolved(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """token_env names an environment variable; Config.secret returns its value."""
    clean_env.setenv("TEST_BROKER_GH_TOKEN", "ghp_s3cret")
    path = write_config(tmp_path, '[integrations.github]\ntoken_env = "TEST_BROKER_GH_TOKEN"\n')
    config = load_config(path)
    assert config.secret("github", "token") == "ghp_s3cret"
    assert "ghp_s3cret" in config.secret_values()


def test_file_reference_is_resolved(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """token_file names a file; Config.secret returns its content without the newline."""
    secret = tmp_path / "gh-token"
    secret.write_text("ghp_from_file\n")
    path = write_config(tmp_path, f'[integrations.github]\ntoken_file = "{secret}"\n')
    assert load_config(path).secret("github", "token") == "ghp_from_file"


def test_relative_file_reference_is_resolved_against_the_config_folder(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A relative token_file is found next to broker.toml, like state_dir and policy."""
    etc = tmp_path / "etc"
    path = write_config(etc, '[integrations.github]\ntoken_file = "gh-token"\n')
    (etc / "gh-token").write_text("ghp_next_to_config\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    clean_env.chdir(elsewhere)
    assert load_config(path).secret("github", "token") == "ghp_next_to_config"


def test_missing_env_var_names_the_key(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A token_env whose variable is unset is a ConfigError naming key and variable."""
    clean_env.delenv("TEST_BROKER_UNSET_VAR", raising=False)
    path = write_config(tmp_path, '[integrations.github]\ntoken_env = "TEST_BROKER_UNSET_VAR"\n')
    config = load_config(path)
    with pytest.raises(ConfigError) as info:
        config.secret("github", "token")
    assert "integrations.github.token_env" in str(info.value)
    assert "TEST_BROKER_UNSET_VAR" in str(info.value)


def test_missing_secret_file_names_the_key(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A token_file that cannot be read is a ConfigError naming the key."""
    path = write_config(tmp_path, f'[integrations.github]\ntoken_file = "{tmp_path}/none"\n')
    with pytest.raises(ConfigError, match=r"integrations\.github\.token_file"):
        load_config(path).secret("github", "token")


def test_unset_secret_is_none(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A secret with neither _env nor _file configured resolves to None."""
    path = write_config(tmp_path, '[integrations.github]\nbase_url = "https://x"\n')
    assert load_config(path).secret("github", "token") is None


def test_quoted_key_reaches_a_table_whose_name_holds_dots(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A remote named github.com is one table: Settings.key quotes it, as TOML does."""
    clean_env.setenv("TEST_BROKER_GH_TOKEN", "ghp_dotted")
    path = write_config(
        tmp_path,
        '[integrations.git.remotes."github.com"]\nurl = "x"\ntoken_env = "TEST_BROKER_GH_TOKEN"\n',
    )
    key = Settings.key("remotes", "github.com", "token")
    assert key == 'remotes."github.com".token'
    assert load_config(path).secret("git", key) == "ghp_dotted"
    assert load_config(path).secret("git", "remotes.github.com.token") is None
    clean_env.delenv("TEST_BROKER_GH_TOKEN")
    with pytest.raises(ConfigError, match=r'integrations\.git\.remotes\."github\.com"\.token_env'):
        load_config(path).secret("git", key)


@pytest.mark.parametrize("part", ["", 'a"b'])
def test_a_key_part_that_cannot_be_written_is_refused(part: str) -> None:
    """Settings.key never builds a key that would name another table."""
    with pytest.raises(ValueError, match="cannot be part of a settings key"):
        Settings.key("remotes", part, "token")


def test_unknown_broker_key_is_refused(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A misspelt [broker] key is refused, naming it."""
    path = write_config(tmp_path, '[broker]\nstate_dri = "/tmp/x"\n')
    with pytest.raises(ConfigError, match=r"broker\.state_dri"):
        load_config(path)


def test_unknown_section_is_refused(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A top-level section the broker does not know is refused, naming it."""
    path = write_config(tmp_path, "[integration.files]\nroot = '/tmp'\n")
    with pytest.raises(ConfigError, match=r"\[integration\]"):
        load_config(path)


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("max_request_bytes = 0", "broker.max_request_bytes"),
        ('max_depth = "64"', "broker.max_depth"),
        ("max_pending_per_sandbox = true", "broker.max_pending_per_sandbox"),
        ('rescan_interval = "soon"', "broker.rescan_interval"),
        ('attachment_grace = "0s"', "broker.attachment_grace"),
    ],
)
def test_bad_broker_values_are_refused(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, line: str, key: str
) -> None:
    """Wrong types or durations under [broker] are refused, naming the key."""
    path = write_config(tmp_path, f"[broker]\n{line}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert key in str(info.value)


def test_bad_toml_is_refused(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A broker.toml that is not TOML is refused, naming the file."""
    path = write_config(tmp_path, "[broker\n")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_missing_explicit_config_is_refused(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A config path given explicitly that does not exist is an error."""
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_config(tmp_path / "nope.toml")


def test_broker_config_env_is_honoured(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With no path given, $BROKER_CONFIG names the file."""
    path = write_config(tmp_path / "etc", '[broker]\nstate_dir = "/srv/broker-state"\n')
    clean_env.setenv("BROKER_CONFIG", str(path))
    config = load_config()
    assert config.source == path
    assert config.state_dir == Path("/srv/broker-state")


def test_missing_broker_config_env_file_is_refused(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """$BROKER_CONFIG pointing at nothing is an error, not silently the defaults."""
    clean_env.setenv("BROKER_CONFIG", str(tmp_path / "gone.toml"))
    with pytest.raises(ConfigError, match=r"gone\.toml"):
        load_config()


def test_explicit_path_wins_over_broker_config_env(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--config (a path argument) beats $BROKER_CONFIG."""
    env_file = write_config(tmp_path / "env", '[broker]\nstate_dir = "/from-env"\n')
    arg_file = write_config(tmp_path / "arg", '[broker]\nstate_dir = "/from-arg"\n')
    clean_env.setenv("BROKER_CONFIG", str(env_file))
    assert load_config(arg_file).state_dir == Path("/from-arg")


def test_config_found_in_state_dir(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without --config or $BROKER_CONFIG, <state>/broker.toml is read."""
    state = tmp_path / "state"
    write_config(state, '[broker]\npolicy = "policy.toml"\n')
    config = load_config(state_dir=state)
    assert config.source == state / "broker.toml"
    assert config.policy_path == state / "policy.toml"
    assert config.state_dir == state


def test_no_config_anywhere_gives_defaults(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No file at all is fine: defaults, no policy, no integrations."""
    config = load_config(state_dir=tmp_path / "state")
    assert config.source is None
    assert config.policy_path is None
    assert dict(config.integrations) == {}
    assert config.limits.max_request_bytes == 1024 * 1024
    assert config.limits.max_depth == 64


def test_relative_paths_resolve_against_config_folder(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Relative state_dir and policy are read from broker.toml's folder, not the cwd."""
    etc = tmp_path / "etc"
    path = write_config(etc, '[broker]\nstate_dir = "state"\npolicy = "rules/policy.toml"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    clean_env.chdir(elsewhere)
    config = load_config(path)
    assert config.state_dir == etc / "state"
    assert config.policy_path == etc / "rules" / "policy.toml"
    assert config.audit_path == etc / "state" / "audit.jsonl"


def test_relative_config_path_gives_absolute_paths(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A relative --config still yields absolute state and policy paths."""
    write_config(tmp_path / "etc", '[broker]\nstate_dir = "state"\npolicy = "p.toml"\n')
    clean_env.chdir(tmp_path)
    config = load_config(Path("etc/broker.toml"))
    assert config.state_dir == tmp_path / "etc" / "state"
    assert config.policy_path == tmp_path / "etc" / "p.toml"


def test_state_and_policy_arguments_win(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--state and --policy override what broker.toml says."""
    path = write_config(tmp_path, '[broker]\nstate_dir = "a"\npolicy = "a.toml"\n')
    config = load_config(path, state_dir=tmp_path / "b", policy=tmp_path / "b.toml")
    assert config.state_dir == tmp_path / "b"
    assert config.policy_path == tmp_path / "b.toml"


def test_integration_settings_are_kept(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """[integrations.X] tables reach the config as given."""
    path = write_config(
        tmp_path,
        '[integrations.files]\nroot = "/srv/x"\n[integrations.github]\n'
        'token_env = "GH"\nbase_url = "https://api.github.com"\n',
    )
    config = load_config(path)
    assert config.integration("files") == {"root": "/srv/x"}
    assert config.integration("github")["base_url"] == "https://api.github.com"
    assert config.integration("s3") == {}


def test_log_format_is_text_or_json(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """[broker] log_format chooses the serve log's form; anything else names the key."""
    assert load_config(write_config(tmp_path, "")).log_format == "text"
    chosen = write_config(tmp_path, '[broker]\nlog_format = "json"\n')
    assert load_config(chosen).log_format == "json"
    with pytest.raises(ConfigError, match=r"broker\.log_format"):
        load_config(write_config(tmp_path, '[broker]\nlog_format = "xml"\n'))
