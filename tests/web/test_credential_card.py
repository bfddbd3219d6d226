"""After apply, the card says what the apply held (scope, provider and id, lifetime,
revoked), applied or failed: on the web page, in /api/v1 and in `broker show`; never
the secret.

Stand-ins: an in-test provider minting a fresh secret per call (tests/credentials/
test_grants.py's), a real broker, the web app on uvicorn, the `broker` command.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker import grants
from broker.testing import BrokerHarness
from tests.credentials.test_grants import MINTED, Refused, Say
from tests.support import BROKER
from tests.web.conftest import Switch, Web, WebServer, _plugged

LINE = "echo: thing/1 only; say:write (by echo:test, n1; lifetime unknown, revoked after)"


@pytest.fixture
def minting(
    tmp_path: Path, served: tuple[Switch, WebServer], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Web]:
    monkeypatch.setitem(grants.BUILTIN, "echo", "tests.credentials.test_grants:EchoProvider")
    MINTED.clear()
    h = BrokerHarness(
        tmp_path / "h",
        handlers=[Say(), Refused()],
        integrations={"echo": {"credential": "e"}},
        credentials={"e": {"kind": "echo"}},
        policy={"rules": [{"effect": "echo.*", "action": "auto"}]},
    )
    with h:
        yield from _plugged(h, served)


@pytest.mark.parametrize("effect,status", [("echo.say", "applied"), ("echo.fail", "failed")])
def test_the_card_after_apply_says_what_was_held(minting: Web, effect: str, status: str) -> None:
    """Web page, API and `broker show`: the credential line; the secret nowhere."""
    h = minting.harness
    result = h.submit(h.request(effect, {}))
    assert result["status"] == status, result
    (secret,) = MINTED
    page = minting.browser().get(f"/requests/default/{result['id']}")
    assert page.status_code == 200 and LINE in page.text
    api = minting.client().get(f"/api/v1/requests/default/{result['id']}").json()
    assert api["credential"] == [LINE]
    shown = show(h, result["id"])
    assert "CREDENTIAL" in shown and "echo: thing/1 only; say:write" in shown
    assert secret not in page.text + str(api) + shown


def show(h: BrokerHarness, ref: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("BROKER_CONFIG", "COLUMNS")}
    done = subprocess.run(
        [str(BROKER), "show", ref, "--state", str(h.state)],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "200"},
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
