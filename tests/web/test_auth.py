"""Approvers and their tokens: `broker web token`, and what broker.toml may hold."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.config import Config
from broker.errors import ConfigError
from broker.registry import Registry
from broker.web.app import create_app
from broker.web.auth import hash_token, load_approvers
from broker.web.cli import app as web_cli


def test_token_command_prints_a_token_and_its_config_lines() -> None:
    """`broker web token alice` prints a token and the TOML lines holding only its hash."""
    result = CliRunner().invoke(web_cli, ["token", "alice"])
    assert result.exit_code == 0
    token = next(line.strip() for line in result.output.splitlines() if "bkr_" in line)
    toml = result.output[result.output.index("[approvers.alice]") :]
    parsed = tomllib.loads(toml)
    assert parsed == {"approvers": {"alice": {"token_sha256": hash_token(token)}}}
    assert load_approvers(parsed["approvers"]) == {"alice": hash_token(token)}
    assert token not in toml


def test_token_command_json_and_fresh_tokens() -> None:
    """--json gives the same facts to scripts; two calls never give the same token."""
    runs = [
        json.loads(CliRunner().invoke(web_cli, ["token", "bob", "--json"]).output) for _ in "ab"
    ]
    assert runs[0]["approver"] == "bob"
    assert runs[0]["token_sha256"] == hash_token(runs[0]["token"])
    assert runs[0]["token"] != runs[1]["token"]


def test_token_command_refuses_an_odd_name() -> None:
    """A name that could not be a TOML key or a clean log entry is refused."""
    result = CliRunner().invoke(web_cli, ["token", "alice\u202e"])
    assert result.exit_code == 2


def test_a_literal_token_in_the_config_is_refused() -> None:
    """broker.toml never holds a token itself: the error says what to write instead."""
    with pytest.raises(ConfigError, match=r"approvers\.alice\.token: .* token_sha256"):
        load_approvers({"alice": {"token": "bkr_secret"}})


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"alice": {"token_sha256": "abc"}}, r"approvers\.alice\.token_sha256: expected"),
        ({"alice": "x"}, r"\[approvers\.alice\] must be a table"),
        ({"alice": {"token_sha256": "a" * 64, "role": "x"}}, r"approvers\.alice\.role: unknown"),
        ({"al ice": {"token_sha256": "a" * 64}}, r"approvers\.al ice"),
        (
            {"alice": {"token_sha256": "a" * 64}, "bob": {"token_sha256": "A" * 64}},
            "the same token as approvers.alice",
        ),
    ],
)
def test_bad_approver_entries_name_their_key(table: dict[str, object], message: str) -> None:
    """Each mistake in [approvers] is refused with the key at fault named."""
    with pytest.raises(ConfigError, match=message):
        load_approvers(table)


def test_the_app_refuses_a_broken_approvers_table(tmp_path: Path) -> None:
    """create_app checks [approvers] before anything is served."""
    config = Config(state_dir=tmp_path, approvers={"alice": {"token": "plain"}})
    with pytest.raises(ConfigError, match=r"never written in broker\.toml"):
        create_app(config, Registry())
