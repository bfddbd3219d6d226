"""The providers' faults: a provider that does not answer hits its deadline and delays
no other sandbox; a revocation the provider refuses is logged and counted; every mint,
refusal and failed revocation is counted per provider on /metrics.

The GitHub App's faults (refused, not revoked, slow) are in tests/effects/github/
test_minted.py, STS's (unreachable, silent) in tests/effects/s3/test_sts.py.

Stand-ins: a real OpenBao (tests/credentials/bao.py); a loopback listener that accepts
and never answers; a real HTTP server; an in-test provider for the counters; a real
broker serving two sandboxes.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pytest_httpserver import HTTPServer

from broker import grants
from broker.config import Config
from broker.credentials.openbao import OpenBao
from broker.errors import CredentialRefused
from broker.grants import Grant, Grants, Scope
from broker.intake.outbox import attach
from broker.loop.pipeline import Broker
from broker.observability.metrics import Metrics
from broker.observability.telemetry import Telemetry
from broker.registry import Registry
from broker.settings import Settings
from broker.testing import BrokerHarness, FakeHandler
from effects.base import Context, EffectFailed
from tests.credentials import bao as bao_server
from tests.credentials.test_grants import Say
from tests.effects.netfixtures import fixture_web, fixture_web_server  # noqa: F401
from tests.support import eventually

SCOPE = Scope("kv", ("hooks/ci",), ("read",))


@pytest.fixture
def silent() -> Iterator[tuple[str, list[socket.socket]]]:
    """A loopback listener that accepts connections and never answers: (URL, accepted)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    listener.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    stop.set()
    thread.join(5)
    for s in [*accepted, listener]:
        s.close()


def test_a_silent_openbao_hits_its_deadline(
    silent: tuple[str, list[socket.socket]], bao_token: str
) -> None:
    """Listener: timeout = 1 ends the mint with a reason; nothing was applied."""
    url, _ = silent
    provider = OpenBao(Settings(bao_server.table(url, timeout=1), "credentials.bao"))
    with pytest.raises(CredentialRefused, match=r"did not answer within 1 s.*nothing was applied"):
        provider.mint(SCOPE, "sb/r1 abc")


def test_a_refused_revocation_is_logged_and_counted(
    tmp_path: Path, bao_token: str, caplog: pytest.LogCaptureFixture
) -> None:
    """OpenBao (its own, sealed after the read): the revocation fails; logged, counted."""
    server, url = bao_server.start(tmp_path)
    try:
        bao_server.put(url, "hooks/ci", {"token": "t0ken-for-the-revocation-test"})
        provider = OpenBao(Settings(bao_server.table(url), "credentials.sealing"))
        session = Grants(lambda: provider, "sb/r2 abc")
        grant = session.credential(SCOPE)
        assert grant is not None
        before = grants.counted().get(("openbao:sealing", "unrevoked"), 0)
        bao_server.seal(url)
        with caplog.at_level(logging.WARNING, logger="broker.grants"):
            (used,) = session.close()
    finally:
        bao_server.stop(server)
    assert used["revoked"] is False
    assert grants.counted()[("openbao:sealing", "unrevoked")] == before + 1
    assert f"could not revoke the credential {grant.id}" in caplog.text
    assert "sealed" in caplog.text and str(grant.expires_at) in caplog.text
    assert "t0ken-for-the-revocation-test" not in caplog.text


def test_a_slow_provider_delays_no_other_sandbox(
    tmp_path: Path, bao_token: str, silent: tuple[str, list[socket.socket]], web: HTTPServer
) -> None:
    """Listener as OpenBao + a real broker with sandboxes slow and calm: while slow's
    mint waits on the provider, calm's request is applied; then slow's fails closed."""
    url, accepted = silent
    header = {"value_kv": "http/ci#token"}
    destination = {"base_url": web.url_for("/"), "secret_headers": {"X-Key": header}}
    http = {
        "credential": "bao",
        "allow_networks": ["127.0.0.0/8"],
        "destinations": {"ci": destination},
    }
    calm = tmp_path / "calm"

    def second(broker: Broker) -> None:
        for sub in ("outbox", "results"):
            (calm / sub).mkdir(parents=True, exist_ok=True)
        broker.add(attach("calm", calm / "outbox", calm / "results", broker.config.state_dir))

    policy = '[[rules]]\neffect = "*"\naction = "auto"\nreason = "test"\n'
    h = BrokerHarness(
        tmp_path / "slow",
        handlers=[FakeHandler("test.quick")],
        integrations={"http": http},
        credentials={"bao": bao_server.table(url, timeout=30)},
        policy=policy,
        sandbox="slow",
        prepare=second,
    )
    with h:
        params = {"method": "GET", "destination": "ci", "path": "/x"}
        h.write("s1.json", h.request("http.request", params, id="s1"))
        eventually(lambda: len(accepted) >= 1)  # the mint is waiting on the provider
        quick = h.request("test.quick", {"value": "v"}, id="c1")
        (calm / "c1.tmp").write_text(json.dumps(quick))
        (calm / "c1.tmp").rename(calm / "outbox" / "c1.json")  # whole, as agents write
        eventually(lambda: (calm / "results" / "c1.json").exists())
        assert not (h.results / "s1.json").exists()  # still minting
        for s in accepted:
            s.close()  # the provider goes away: the mint fails, nothing is sent
        result = h.wait("s1", timeout=30)
    assert result["status"] == "failed" and "nothing was applied" in result["reason"]
    assert web.log == []


class Moody:
    """Mints `thing/ok`, refuses `thing/no`, mints `thing/stuck` and cannot revoke it."""

    name = "moody:test"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def mint(self, scope: Scope, ref: str) -> Grant:
        if scope.resources == ("thing/no",):
            raise CredentialRefused("failed: the provider says no; nothing was applied")
        return Grant(scope, self.name, scope.resources[0], None, {"token": f"moody-{ref[:8]}"})

    def revoke(self, grant: Grant) -> None:
        if grant.id == "thing/stuck":
            raise CredentialRefused("the provider cannot revoke it")


class Ask(Say):
    """moody.ask: asks for the credential of `params.thing`."""

    name = "moody.ask"

    @property
    def schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": {"thing": {"type": "string"}}}

    def apply(self, params: Any, ctx: Context) -> dict[str, Any]:
        if ctx.credential(Scope("echo", (params["thing"],), ("say:write",))) is None:
            raise EffectFailed("failed: no provider")
        return {"asked": params["thing"]}


def test_mints_refusals_and_failed_revocations_are_counted_per_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-test provider + a real broker + its metrics: one of each, by provider."""
    monkeypatch.setitem(grants.BUILTIN, "moody", f"{__name__}:Moody")
    telemetry = Telemetry.from_config(Config(state_dir=tmp_path, metrics={}), Registry())
    before = _credential_samples(None)
    h = BrokerHarness(
        tmp_path / "h",
        handlers=[Ask()],
        builtins=False,
        integrations={"moody": {"credential": "m"}},
        credentials={"m": {"kind": "moody"}},
        policy={"rules": [{"effect": "moody.ask", "action": "auto"}]},
        prepare=telemetry.attach,
    )
    with h:
        for thing in ("thing/ok", "thing/no", "thing/stuck"):
            h.submit(h.request("moody.ask", {"thing": thing}))
        metrics = telemetry.metrics
        assert isinstance(metrics, Metrics)
        after = _credential_samples(metrics)
    telemetry.close()
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    assert delta == {
        ("broker_credentials_minted_total", "moody:test"): 2.0,
        ("broker_credentials_refused_total", "moody:test"): 1.0,
        ("broker_credentials_revoke_failed_total", "moody:test"): 1.0,
    }


def _credential_samples(metrics: Metrics | None) -> dict[tuple[str, str], float]:
    registry = (metrics or Metrics(())).registry
    found = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if (
                s.name.startswith("broker_credentials_")
                and s.labels.get("provider") == "moody:test"
            ):
                found[(s.name, s.labels["provider"])] = s.value
    return found
