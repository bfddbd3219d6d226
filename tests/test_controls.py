"""The controls people change on running brokers, on both store back ends: the kill
switch (audited, seen by every connection of the store at once) and the generation a
running broker reloads on; and the history quotas and `after` conditions count."""

from __future__ import annotations

import pytest

from broker.errors import ControlError
from broker.lifecycle.transitions import Lifecycle
from broker.models import Record, Verdict
from broker.policy.controls import RULE, LiveControls, disable, enable, switches
from broker.policy.ruleset import parse_policy
from broker.policy.verdict import decide, ledger_history
from tests.stores import OpenStore, chained_events

REVERSIBLE = {"files.write": True, "email.send": False, "http.request": False}


def test_a_kill_switch_is_seen_by_another_connection_and_audited(open_store: OpenStore) -> None:
    mine, theirs = open_store(), open_store(host="beta")
    live = LiveControls(theirs)
    live.refresh()
    assert live.disabled("github.pull_request.create") is None
    disable(mine, "github.*", "a runaway agent opens PRs", "alice")
    assert live.refresh() is True  # the generation moved
    switch = live.disabled("github.pull_request.create")
    assert switch is not None and switch.by == "alice"
    assert "a runaway agent opens PRs" in switch.denial("github.pull_request.create")
    assert live.disabled("files.write") is None
    assert live.refresh() is False  # nothing changed since
    enable(theirs, "github.*", "bob")
    live.refresh()
    assert live.disabled("github.pull_request.create") is None
    kinds = [(e["event"], e["by"], e["effect"]) for e in chained_events(mine)]
    kinds += [(e["event"], e["by"], e["effect"]) for e in chained_events(theirs) if theirs.shared]
    assert ("effect_disabled", "alice", "github.*") in kinds
    assert ("effect_enabled", "bob", "github.*") in kinds


def test_enable_names_what_is_disabled(open_store: OpenStore) -> None:
    store = open_store()
    disable(store, "s3.put", "bucket migration", "alice")
    with pytest.raises(ControlError, match=r"'s3\.\*' is not disabled \(disabled now: s3\.put\)"):
        enable(store, "s3.*", "alice")
    with pytest.raises(ControlError, match="needs a reason"):
        disable(store, "s3.get", "  ", "alice")
    assert [s.glob for s in switches(store)] == ["s3.put"]


def test_remembered_rules_load_and_a_broken_one_allows_nothing(open_store: OpenStore) -> None:
    store = open_store()
    with store.transaction():
        key = store.next_control_key(RULE)
        rule = {"effect": "email.send", "when": {"to": "ops@example.com"}, "action": "auto"}
        store.put_control(RULE, key, {"rule": rule, "from": "sb/1"})
        store.put_control(RULE, store.next_control_key(RULE), {"rule": {"effect": "email.*"}})
    live = LiveControls(store)
    live.refresh()
    assert [r.label for r in live.remembered] == [f"remembered[{key}]"]


def _record(
    store: object, sandbox: str, rid: str, effect: str, params: dict[str, object]
) -> Record:
    import json

    from broker.models import sha256_hex

    payload = json.dumps({"version": 1, "id": rid, "effect": effect, "params": params})
    return Record(
        sandbox=sandbox,
        id=rid,
        name=rid,
        state="received",
        received_at="2026-12-01T10:00:00.000Z",
        effect=effect,
        payload=payload,
        sha256=sha256_hex(payload.encode()),
    )


def test_quotas_and_history_count_from_the_ledger(open_store: OpenStore) -> None:
    policy = parse_policy(
        {
            "rules": [
                {
                    "effect": "files.write",
                    "when": {"path": "out/*"},
                    "after": {"effect": "files.write", "when": {"path": "secrets/*"}},
                    "action": "approve",
                    "reason": "writing out after reading secrets",
                }
            ],
            "limits": [{"effect": "files.*", "max": 3, "action": "deny"}],
        },
        REVERSIBLE,
        "test",
    )
    store = open_store()
    life = Lifecycle(store)
    auto = Verdict("auto", "default", "reversible")

    def ask(rid: str, path: str, sandbox: str = "sb") -> Verdict:
        record = _record(store, sandbox, rid, "files.write", {"path": path})
        with store.transaction():
            life.receive(record)
            verdict, _ = decide(
                policy,
                None,
                "files.write",
                {"path": path},
                reversible=True,
                history=ledger_history(store, sandbox, rid),
            )
            if verdict.action == "auto":
                life.auto(record, auto)
            elif verdict.action == "approve":
                life.park(record, verdict, {"title": "t", "target": "t", "body": "", "facts": []})
        return verdict

    assert ask("1", "out/a.txt").action == "auto"  # nothing happened before it
    assert ask("2", "secrets/key.txt").action == "auto"
    third = ask("3", "out/b.txt")
    assert (third.action, third.rule) == ("approve", "rules[0]")
    fourth = ask("4", "notes.txt")
    assert fourth.action == "deny"
    assert fourth.reason.startswith("quota: 3 of 3 files.* requests used in this sandbox")
    assert ask("1", "out/a.txt", sandbox="other").action == "auto"  # counted per sandbox
