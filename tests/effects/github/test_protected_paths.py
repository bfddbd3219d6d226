"""Finding 3: a pull request built from `files` honours [integrations.github]
protected_paths, and its paths are canonical before any rule sees them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker.testing import BrokerHarness
from tests.effects.github.support import Hub, pr
from tests.support import checked

AUTO_PRS = """
[[rules]]
effect = "github.pull_request.create"
action = "auto"
reason = "agents may open pull requests"
"""


@pytest.mark.parametrize("path", [".github/workflows/ci.yml", "./.github/workflows/ci.yml"])
def test_pr_from_files_touching_a_protected_path_waits(hub: Hub, tmp_path: Path, path: str) -> None:
    """Stand-in: the fake GitHub. Under an auto rule for PRs, files under a protected path
    (however spelled) make the request wait for a person: no blob, tree, commit, branch
    or pull request is created."""
    settings = {**hub.settings, "protected_paths": [".github/workflows/*"]}
    with BrokerHarness(tmp_path / "h", policy=AUTO_PRS, integrations={"github": settings}) as h:
        time.sleep(0.15)
        files = [{"path": path, "content": "on: push\n"}]
        result = checked(
            h.submit(h.request("github.pull_request.create", pr(files=files)), terminal=False)
        )
        assert result["status"] == "pending", result
        assert ".github/workflows/ci.yml" in result["reason"]
    assert [c for c in hub.fake.called("POST")] == []
    assert hub.sha("agent/fix") is None


def test_pr_from_unprotected_files_is_opened(hub: Hub, tmp_path: Path) -> None:
    """Stand-in: the fake GitHub. Files outside the protected paths: the auto rule holds."""
    settings = {**hub.settings, "protected_paths": [".github/workflows/*"]}
    with BrokerHarness(tmp_path / "h", policy=AUTO_PRS, integrations={"github": settings}) as h:
        time.sleep(0.15)
        files = [{"path": "docs/./new.md", "content": "new\n"}]
        result = checked(
            h.submit(h.request("github.pull_request.create", pr(files=files)), timeout=30)
        )
    assert result["status"] == "applied", result
    assert hub.show("agent/fix", "docs/new.md") == "new\n"
