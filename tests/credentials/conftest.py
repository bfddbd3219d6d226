"""The OpenBao the credential tests share (tests/credentials/bao.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.credentials import bao as bao_server


@pytest.fixture(scope="module")
def bao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A dev OpenBao on loopback; each test writes the secrets it reads."""
    server, url = bao_server.start(tmp_path_factory.mktemp("bao"))
    yield url
    bao_server.stop(server)


@pytest.fixture
def bao_token(monkeypatch: pytest.MonkeyPatch) -> str:
    """The broker's own OpenBao token, in the environment only."""
    monkeypatch.setenv(bao_server.TOKEN_ENV, bao_server.ROOT_TOKEN)
    return bao_server.ROOT_TOKEN
