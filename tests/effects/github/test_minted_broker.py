"""Through a real broker: an apply's minted credential is recorded by its scope, and the
credential itself is in no result, ledger row, audit line or log line (the canary).

Stand-in: the fake GitHub, issuing the App's narrowed tokens and recording them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from broker.testing import BrokerHarness
from effects.github import APP_TOKEN_CALL
from tests.effects.github.support import REPO, Hub, app_key
from tests.support import eventually

POLICY = """
[[rules]]
effect = "github.issue.create"
action = "auto"
reason = "issues are cheap to close"
"""


def test_the_minted_token_is_recorded_by_scope_and_never_written(
    tmp_path: Path, hub: Hub, caplog: pytest.LogCaptureFixture
) -> None:
    """Fake: the result, the ledger and the audit event say the scope; no byte holds the token."""
    key_file, public = app_key(tmp_path)
    hub.fake.app = (4242, public, 77)
    table = {"kind": "github_app", "app_id": 4242, "installation_id": 77}
    settings: dict[str, Any] = {**hub.settings, "credential": "acme-app"}
    del settings["token_env"]
    h = BrokerHarness(
        tmp_path / "broker",
        integrations={"github": settings},
        credentials={"acme-app": {**table, "private_key_file": str(key_file)}},
        policy=POLICY,
    )
    with caplog.at_level(logging.DEBUG), h:
        result = h.submit(h.request("github.issue.create", {"repo": REPO, "title": "minted"}))
    assert result["status"] == "applied", result
    (used,) = result["output"]["credential"]
    assert used["scope"] == "github: acme/api only; issues:write, metadata:read"
    assert used["revoked"] is True and used["provider"] == "github_app:acme-app"
    assert len(hub.fake.called(*APP_TOKEN_CALL)) == 1
    token = hub.fake.revoked[0]
    audit = eventually(lambda: _with_credential(h.config.audit_path))
    assert used["id"] in audit
    written = [*h.results.glob("*.json"), h.config.ledger_path, h.config.audit_path]
    for path in [*written, *h.state.rglob("*")]:
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path
    assert token not in caplog.text


def _with_credential(path: Path) -> str:
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return next((line for line in text.splitlines() if '"credential"' in line), "")
