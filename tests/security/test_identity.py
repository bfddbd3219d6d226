"""Finding 4: one person cannot meet a two-person quorum, by setting $USER or by
spelling a name two ways."""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.errors import ConfigError, DecisionError
from broker.identity import approver_name, os_user
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, FakeHandler
from broker.web.auth import load_approvers
from tests.support import BROKER

TWO_PEOPLE = """
[[rules]]
effect = "test.record"
action = "approve"
approvals = 2
reason = "two people must agree"
"""


@pytest.fixture
def quorum(tmp_path: Path) -> Iterator[BrokerHarness]:
    """A broker where test.record needs two approvals."""
    with BrokerHarness(tmp_path / "h", handlers=[FakeHandler()], policy=TWO_PEOPLE) as h:
        yield h


def broker_cli(
    h: BrokerHarness, *args: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    return subprocess.run(
        [str(BROKER), *args, "--state", str(h.state)],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=30,
    )


def waiting(h: BrokerHarness) -> dict[str, Any]:
    result = h.submit(h.request("test.record", {"value": "v"}), terminal=False)
    assert result["status"] == "pending"
    return result


def decisions(h: BrokerHarness, rid: str) -> tuple[str, list[str]]:
    ledger = Ledger(h.config.ledger_path)
    try:
        record = ledger.find(rid)
        return record.state, [d.approver for d in ledger.decisions(*record.key)]
    finally:
        ledger.close()


def test_user_and_logname_do_not_change_who_approves(quorum: BrokerHarness) -> None:
    """`USER=alice broker approve` then `USER=bob broker approve`: one person (the
    effective uid's account), so the second is refused and the request still waits."""
    rid = waiting(quorum)["id"]
    me = pwd.getpwuid(os.geteuid()).pw_name
    first = broker_cli(quorum, "approve", rid, env={"USER": "alice", "LOGNAME": "alice"})
    assert first.returncode == 0, first.stderr
    second = broker_cli(quorum, "approve", rid, env={"USER": "bob", "LOGNAME": "bob"})
    assert second.returncode != 0
    assert "already decided" in second.stderr
    assert decisions(quorum, rid) == ("pending", [me])


@pytest.mark.parametrize("again", ["alice ", "ALICE", " Alice", "\uff41lice"])
def test_one_name_spelled_twice_is_one_person(quorum: BrokerHarness, again: str) -> None:
    """With allow_as, `alice` then a spelling differing by case, spaces or width is the
    same person: the quorum is not met."""
    (quorum.state / "broker.toml").write_text("[broker]\nallow_as = true\n")
    rid = waiting(quorum)["id"]
    assert broker_cli(quorum, "approve", rid, "--as", "alice", env={}).returncode == 0
    second = broker_cli(quorum, "approve", rid, "--as", again, env={})
    assert second.returncode != 0 and "already decided" in second.stderr
    assert decisions(quorum, rid) == ("pending", ["alice"])


def test_two_people_meet_the_quorum(quorum: BrokerHarness) -> None:
    """Two different names approve: the request is applied."""
    (quorum.state / "broker.toml").write_text("[broker]\nallow_as = true\n")
    rid = waiting(quorum)["id"]
    for name in ("alice", "bob"):
        assert broker_cli(quorum, "approve", rid, "--as", name, env={}).returncode == 0
    assert quorum.wait(rid)["status"] == "applied"


def test_names_are_normalised_and_odd_ones_refused() -> None:
    """Trimmed, case-folded, NFKC, inner whitespace one space; a name with other
    punctuation or control characters is refused."""
    assert approver_name("  Alice@Example.COM ") == "alice@example.com"
    assert approver_name("Chatbot:Alice") == "chatbot:alice"
    assert approver_name("autogen  (run\tcancelled)") == "autogen (run cancelled)"
    for bad in ("", "al;ice", "al/ice", "al\u202eice", "-alice", "a" * 65):
        with pytest.raises(DecisionError):
            approver_name(bad)
    assert os_user() == approver_name(pwd.getpwuid(os.geteuid()).pw_name)


def test_web_approvers_differing_only_in_case_are_refused() -> None:
    """[approvers.Alice] and [approvers.alice] would be two tokens for one person."""
    digest = "a" * 64
    with pytest.raises(ConfigError, match="same person"):
        load_approvers({"Alice": {"token_sha256": digest}, "alice": {"token_sha256": "b" * 64}})
    assert list(load_approvers({"Alice": {"token_sha256": digest}})) == ["alice"]
