"""No service call under the ledger's write lock: a handler whose service hangs while
the broker asks what a request would do (its reversibility, its preview) delays no
other sandbox and no decision; past its deadline the request waits for a person
without a preview, and is never applied on a guess. Against a real `broker serve`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.crash.support import (
    BrokerProcess,
    Receiver,
    Site,
    read_results,
    wait_for,
    write_atomically,
)

GATED = '[[rules]]\neffect = "crashtest.slow"\naction = "approve"\nreason = "slow needs a look"\n'


class Host:
    """`broker serve --root` over two sandboxes, a and b."""

    def __init__(self, root: Path, receiver: Receiver, policy: str, extra: str = "") -> None:
        self.site = Site(root, receiver.url, policy=policy, broker_extra=extra, attach=False)
        for name in ("a", "b"):
            for sub in ("outbox", "results"):
                (self.site.state / "sandboxes" / name / sub).mkdir(parents=True)
        self.process: BrokerProcess | None = None

    def start(self) -> None:
        self.process = self.site.start()
        wait_for(lambda: "serving" in self.output(), 30, "the broker to start")

    def output(self) -> str:
        return self.process.output() if self.process else ""

    def write(self, sandbox: str, rid: str, effect: str, **params: Any) -> None:
        doc = {"version": 1, "id": rid, "effect": effect, "params": params}
        write_atomically(self.site.state / "sandboxes" / sandbox / "outbox", f"{rid}.json", doc)

    def result(self, sandbox: str, rid: str) -> dict[str, Any]:
        return read_results(self.site.state / "sandboxes" / sandbox / "results").get(rid, {})

    def wait(self, sandbox: str, rid: str, status: str, timeout: float = 20) -> dict[str, Any]:
        wait_for(
            lambda: self.result(sandbox, rid).get("status") == status,
            timeout,
            f"{sandbox}/{rid} {status}",
        )
        return self.result(sandbox, rid)

    def release(self) -> None:
        (self.site.state / "release").touch()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def host(tmp_path: Path, receiver: Receiver) -> Iterator[Host]:
    h = Host(tmp_path / "host", receiver, GATED)
    h.start()
    yield h
    if h.process is not None:
        h.release()
        h.process.stop()


def test_hung_preview_delays_no_other_sandbox_and_no_decision(
    host: Host, receiver: Receiver
) -> None:
    """While a's preview hangs, b's automatic request is answered and a CLI approval of
    b's waiting request commits and is applied; released, a's request waits with its card."""
    host.write("b", "send1", "crashtest.send", value="to approve")
    host.wait("b", "send1", "pending")
    host.write("a", "slow1", "crashtest.slow", value="hangs")
    wait_for(lambda: not (host.site.state / "sandboxes/a/outbox/slow1.json").exists(), 10, "a read")

    host.write("b", "noop1", "crashtest.noop", value="quick")
    assert host.wait("b", "noop1", "applied")["output"] == {"value": "quick"}
    done = host.site.cli("approve", "b/send1", "--reason", "fine", timeout=30)
    assert done.returncode == 0, done.stderr
    host.wait("b", "send1", "applied")
    assert receiver.count("b/send1") == (1, 1)
    assert host.result("a", "slow1") == {}, "a's request was answered before its preview"

    host.release()
    host.wait("a", "slow1", "pending")
    card = json.loads(host.site.cli("show", "a/slow1", "--json").stdout)
    assert card["what"]["title"] == "crashtest.slow 'hangs'"


def test_preview_past_its_deadline_waits_without_one(tmp_path: Path, receiver: Receiver) -> None:
    """A preview that never comes: past preview_timeout the request is pending, its card
    says why there is no preview, and nothing is applied."""
    h = Host(tmp_path / "host", receiver, GATED, extra='preview_timeout = "1s"')
    h.start()
    try:
        h.write("a", "slow2", "crashtest.slow", value="never")
        result = h.wait("a", "slow2", "pending")
        card = json.loads(h.site.cli("show", "a/slow2", "--json").stdout)
        h.write("b", "noop2", "crashtest.noop", value="after")
        h.wait("b", "noop2", "applied")
    finally:
        h.release()
        assert h.process is not None
        h.process.stop()
    assert card["what"]["title"] == "the preview could not be computed"
    assert "did not answer within 1s" in card["what"]["body"]
    assert result["reason"].startswith("waiting for 1 approval(s)")
    assert "did not answer within 1s" in h.output()


def test_assessment_past_its_deadline_is_never_applied_on_a_guess(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A reversible effect (auto by default) whose reversibility check hangs is treated as
    irreversible past the deadline: it waits for a person instead of being applied."""
    h = Host(tmp_path / "host", receiver, "", extra='preview_timeout = "1s"')
    h.start()
    try:
        h.write("a", "fast", "crashtest.slow", value="assessed at once")
        fast = h.wait("a", "fast", "applied")
        h.write("a", "hung", "crashtest.slow", value="unknown", gate="assess")
        hung = h.wait("a", "hung", "pending")
    finally:
        h.release()
        assert h.process is not None
        h.process.stop()
    assert fast["reason"].startswith("applied automatically (default)")
    assert "irreversible effects wait for a person" in hung["reason"]
