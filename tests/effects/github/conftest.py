"""github.* against two stand-ins on 127.0.0.1, each named in every test's docstring.

- the fake (tests/effects/github/fake.py): a recording GitHub with state, backed by a
  real bare repository, for behaviour that depends on state (idempotency, a base or blob
  that moved, undo) and for faults;
- Prism serving GitHub's official OpenAPI description (scripts/prism-up.sh), stateless,
  which rejects any request that does not match GitHub's schema: every REST call the
  handlers make is sent to it. Without Prism those tests skip, and say why; with CI set
  they fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.integrations.github_threads import THREAD_CALLS
from effects.github import APP_REVOKE_CALL, APP_TOKEN_CALL, Api
from tests.effects.github.fake import FakeGitHub, seed_repo
from tests.effects.github.prism import (
    GITHUB_SPEC_FILE,
    Prism,
    RecordingProxy,
    installed,
    subset_spec,
)
from tests.effects.github.support import REPO, SEED, TOKEN, TOKEN_ENV, Hub


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    """The fake GitHub with acme/api; the token only in the environment."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    remote = tmp_path / "api.git"
    seed_repo(remote, SEED)
    state = tmp_path / "state"
    state.mkdir()
    with FakeGitHub(token=TOKEN) as fake:
        fake.add_repo(REPO, remote)
        settings = {"token_env": TOKEN_ENV, "base_url": fake.url, "repos": ["acme/*"]}
        yield Hub(fake, remote, state, settings)


@pytest.fixture(scope="session")
def prism_launch() -> Prism | None:
    """The run's Prism, loading in the background (None when not installed); `prism`
    waits for it. The workers share one (tests/conftest.py stops it at the run's end)."""
    if not installed():
        return None
    operations = [
        *Api.operations().values(),
        APP_TOKEN_CALL,
        APP_REVOKE_CALL,
        *THREAD_CALLS.values(),
    ]

    def spec(folder: Path) -> Path:
        if os.environ.get("PRISM_FULL_SPEC"):
            return GITHUB_SPEC_FILE
        return subset_spec(GITHUB_SPEC_FILE, operations, folder / "github-subset.json")

    return Prism.shared(spec)


@pytest.fixture(scope="module", autouse=True)
def prism_early(prism_launch: Prism | None) -> None:
    """Start Prism as this module starts, so its load overlaps the fake's tests."""


@pytest.fixture(scope="session")
def prism(prism_launch: Prism | None) -> Iterator[RecordingProxy]:
    """A recording proxy in front of a ready Prism; skips (fails under CI) without Prism."""
    if prism_launch is None:
        message = (
            "Prism is not installed: run `make prism` (scripts/prism-up.sh) to test the "
            "GitHub calls against GitHub's OpenAPI description"
        )
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {message}")
        pytest.skip(message)
    prism_launch.wait()
    proxy = RecordingProxy(prism_launch.url)
    yield proxy
    proxy.stop()
