"""The seam (broker/grants.py): one Grant per scope per call, revoked at the call's end;
what the broker records of it; a handler echoing its minted secret is masked.

Stand-in: an in-test provider (the providers themselves are tested against real
servers beside this file and under tests/effects/).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from broker import grants
from broker.grants import Grant, Grants, Scope, kind_of_credential
from broker.settings import Settings
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness
from effects.base import Context, EffectFailed, Handler, Preview
from tests.support import eventually

SCOPE = Scope("echo", ("thing/1",), ("say:write",))
MINTED: list[str] = []
REVOKED: list[str] = []


class EchoProvider:
    """Mints a fresh secret per call and remembers what it revoked."""

    name = "echo:test"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def mint(self, scope: Scope, ref: str) -> Grant:
        secret = f"minted-secret-{len(MINTED)}-{ref.split()[0].replace('/', '-')}"
        MINTED.append(secret)
        return Grant(scope, self.name, f"n{len(MINTED)}", None, {"token": secret})

    def revoke(self, grant: Grant) -> None:
        REVOKED.append(grant.token)


class Say(Handler):
    """echo.say: returns (and so would leak) the credential it was given."""

    name = "echo.say"
    reversible = True
    idempotent = True
    config_keys = frozenset({"credential"})

    @property
    def schema(self) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": False}

    def preview(self, params: Any, ctx: Context) -> Preview:
        return Preview(title="say", target="echo")

    def apply(self, params: Any, ctx: Context) -> dict[str, Any]:
        grant = ctx.credential(SCOPE)
        assert grant is not None
        return {"said": grant.token, "again": ctx.credential(SCOPE) is grant}


@pytest.fixture(autouse=True)
def echo_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(grants.BUILTIN, "echo", f"{__name__}:EchoProvider")
    MINTED.clear()
    REVOKED.clear()


def test_one_grant_per_scope_per_call_revoked_once() -> None:
    """A second ask for the same scope gets the same grant; close revokes it once."""
    session = Grants(lambda: EchoProvider(Settings({}, "credentials.e")), "sb/r1 abc")
    first = session.credential(SCOPE)
    assert session.credential(SCOPE) is first
    other = session.credential(Scope("echo", ("thing/2",), ("say:write",)))
    assert other is not first and len(MINTED) == 2
    assert [u["revoked"] for u in session.close()] == [True, True]
    session.close()
    assert sorted(REVOKED) == sorted(MINTED)


def test_what_an_integration_applies_with_is_named() -> None:
    """Minted (with the provider), standing (static references) or none."""
    credentials = {"e": {"kind": "echo"}}
    minted = kind_of_credential(Settings({"credential": "e"}, "integrations.x"), credentials)
    assert minted.startswith("minted per apply (echo:test)")
    standing = Settings({"token_env": "T"}, "integrations.x")
    assert kind_of_credential(standing, credentials) == "standing credential"
    assert kind_of_credential(Settings({"root": "/x"}, "integrations.x"), credentials) == "none"


def test_a_handler_echoing_its_minted_secret_is_masked(tmp_path: Path) -> None:
    """Through a broker: the result says the scope, and never the secret it echoed."""
    h = BrokerHarness(
        tmp_path,
        handlers=[Say()],
        integrations={"echo": {"credential": "e"}},
        credentials={"e": {"kind": "echo"}},
        policy={"rules": [{"effect": "echo.say", "action": "auto"}]},
    )
    with h:
        result = h.submit(h.request("echo.say", {}))
    assert result["status"] == "applied", result
    (secret,) = MINTED
    assert [secret] == REVOKED
    assert secret not in str(result) and result["output"]["again"] is True
    assert result["output"]["credential"][0]["scope"] == "echo: thing/1 only; say:write"
    for path in [*h.results.glob("*.json"), *h.state.rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


class Refused(Say):
    """echo.fail: mints, then the service refuses."""

    name = "echo.fail"

    def apply(self, params: Any, ctx: Context) -> dict[str, Any]:
        grant = ctx.credential(SCOPE)
        assert grant is not None
        raise EffectFailed(f"failed: the service said no to {grant.token}")


def test_a_failed_apply_revokes_and_audits_the_scope(tmp_path: Path) -> None:
    """Through a broker: the failure's audit event names the scope; the secret is masked."""
    h = BrokerHarness(
        tmp_path,
        handlers=[Refused()],
        integrations={"echo": {"credential": "e"}},
        credentials={"e": {"kind": "echo"}},
        policy={"rules": [{"effect": "echo.fail", "action": "auto"}]},
    )
    with h:
        result = h.submit(h.request("echo.fail", {}))
    assert result["status"] == "failed", result
    (secret,) = MINTED
    assert [secret] == REVOKED and secret not in str(result)
    line = eventually(lambda: _failed_line(h.config.audit_path))
    (audited,) = json.loads(line)["credential"]
    assert audited["scope"] == "echo: thing/1 only; say:write"
    assert (audited["provider"], audited["id"], audited["revoked"]) == ("echo:test", "n1", True)
    assert audited["minted_at"] and "lifetime" in audited  # None: the provider gave no expiry
    row = Ledger(h.config.ledger_path).get("default", result["id"])
    assert row is not None and row.state == "failed"
    assert row.output == {"credential": [audited]}  # the row keeps it, as the result does


def _failed_line(path: Path) -> str:
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return next((x for x in text.splitlines() if '"failed"' in x and "credential" in x), "")
