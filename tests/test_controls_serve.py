"""Kill switch, quotas and history conditions on a real `broker serve`, driven by the
real CLI: what an operator does on a running broker, and what the agent reads back."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from broker.testing import BrokerHarness, FakeClock
from tests.support import ServeSite, eventually, run_broker

QUOTA = """
[[rules]]
effect = "files.write"
when = { path = "gate/*" }
action = "approve"
reason = "files under gate/ are read by a person first"

[[rules]]
effect = "files.write"
when = { path = "out/*" }
after = { effect = "files.write", when = { path = "secrets/*" } }
action = "approve"
reason = "this sandbox wrote secrets earlier: a person reads what goes out"

[[limits]]
effect = "files.write"
max = 4
action = "deny"
reason = "ask for a bigger quota in #agents"
"""


def written(site: ServeSite, name: str) -> bool:
    return any(site.exports.rglob(name))


def audit_events(site: ServeSite) -> list[dict[str, object]]:
    log = site.state / "audit.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def test_the_kill_switch_holds_on_a_running_broker_at_once(tmp_path: Path, home: Path) -> None:
    site = ServeSite(tmp_path / "site", home)
    serving = site.serve()
    try:
        before = site.request("files.write", path="a.txt", content="one")
        assert site.result(before, "applied")["status"] == "applied"
        held = site.request("files.write", path="gate/x.txt", content="for a person")
        site.result(held, "pending")

        said = site.cli("effects", "disable", "files.*", "--reason", "exports are frozen")
        assert said.startswith("disabled files.* (files.write) by ")
        off = site.request("files.write", path="b.txt", content="two")
        denied = site.result(off, "denied")
        assert "files.write is disabled by" in denied["reason"]
        assert "exports are frozen" in denied["reason"]
        assert not written(site, "b.txt")
        explained = site.cli("policy", "explain", str(_request_file(tmp_path, "b.txt")))
        assert "kill switch (files.*): files.write is disabled by" in explained
        assert "→ deny by disabled:files.*" in explained
        listing = json.loads(site.cli("effects", "--json"))
        files = next(e for e in listing if e["effect"] == "files.write")
        assert files["disabled"]["reason"] == "exports are frozen"

        # approved by a person after the switch: still not applied
        told = site.cli("approve", held, "--reason", "fine")
        assert "the broker applies it" not in told  # issue 24: it says what happens
        assert "files.write is switched off" in told and "denies it instead" in told
        halted = site.result(held, "denied")
        assert "exports are frozen" in halted["reason"]
        assert not written(site, "x.txt")

        site.cli("effects", "enable", "files.*")
        after = site.request("files.write", path="c.txt", content="three")
        site.result(after, "applied")
        assert written(site, "c.txt")
    finally:
        serving.close()
    events = [e for e in audit_events(site) if str(e["event"]).startswith("effect_")]
    assert [(e["event"], e["effect"]) for e in events] == [
        ("effect_disabled", "files.*"),
        ("effect_enabled", "files.*"),
    ]
    assert events[0]["by"] and events[0]["reason"] == "exports are frozen"
    verify = run_broker("audit", "verify", "--config", str(site.config), home=home)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # the same policy replayed: a switch's denials are no policy change to report
    policy = str(site.config.parent / "policy.toml")
    replayed = run_broker(
        "policy", "replay", policy, "--json", "--config", str(site.config), home=home
    )
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    report = json.loads(replayed.stdout)
    assert report["skipped"]["denied by a kill switch, not by the policy"] == 1


def test_enable_of_what_is_not_disabled_is_one_line(tmp_path: Path, home: Path) -> None:
    site = ServeSite(tmp_path / "site", home)
    unused = run_broker(
        "effects", "disable", "files.*", "--reason", "x", "--config", str(site.config), home=home
    )
    # a switch written to a state dir no broker uses would protect nothing: refused
    assert unused.returncode != 0 and "no broker has used the state dir" in unused.stderr
    site.serve().close()
    site.cli("effects", "disable", "files.write", "--reason", "maintenance")
    done = run_broker("effects", "enable", "files.*", "--config", str(site.config), home=home)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "error: 'files.*' is not disabled (disabled now: files.write)"
    ]
    none = run_broker(
        "effects", "disable", "file.*", "--reason", "x", "--config", str(site.config), home=home
    )
    assert none.returncode != 0 and "no registered effect matches 'file.*'" in none.stderr


def test_quotas_count_a_burst_and_survive_a_restart(tmp_path: Path, home: Path) -> None:
    site = ServeSite(tmp_path / "site", home)
    (site.config.parent / "policy.toml").write_text(QUOTA)
    # six at once: the broker may read them in one wake-up; the quota still holds
    ids = [site.request("files.write", path=f"burst{i}.txt", content="x") for i in range(6)]
    serving = site.serve()
    try:
        results = [site.result(rid) for rid in ids]
        assert sorted(r["status"] for r in results) == ["applied"] * 4 + ["denied"] * 2
        refused = [r for r in results if r["status"] == "denied"]
        assert all(
            "quota: 4 of 4 files.write used in this sandbox; ask for a bigger quota in #agents"
            in r["reason"]
            for r in refused
        )
    finally:
        stopped = serving.stop(signal.SIGTERM)
        serving.close()
    assert stopped == 0
    serving = site.serve()
    try:
        again = site.request("files.write", path="later.txt", content="x")
        assert "quota: 4 of 4" in site.result(again, "denied")["reason"]
        assert not written(site, "later.txt")
    finally:
        serving.close()


def test_a_history_condition_looks_at_earlier_effects(tmp_path: Path, home: Path) -> None:
    site = ServeSite(tmp_path / "site", home)
    (site.config.parent / "policy.toml").write_text(QUOTA)
    serving = site.serve()
    try:
        first = site.request("files.write", path="out/report.txt", content="fine")
        site.result(first, "applied")
        site.result(site.request("files.write", path="secrets/key.txt", content="k"), "applied")
        second = site.request("files.write", path="out/report2.txt", content="key inside")
        waiting = site.result(second, "pending")
        assert "wrote secrets earlier" in waiting["reason"]
        explained = run_broker(
            "policy",
            "explain",
            str(_request_file(tmp_path, "out/x.txt")),
            "--sandbox",
            "sb1",
            "--config",
            str(site.config),
            home=home,
        )
        assert explained.returncode == 0, explained.stderr
        assert "this sandbox made an earlier files.write, path matching 'secrets/*'" in (
            explained.stdout
        )
        assert "→ approve by rules[1]" in explained.stdout
    finally:
        serving.close()


def _request_file(tmp_path: Path, path: str) -> Path:
    doc = {"version": 1, "id": "x1", "effect": "files.write", "params": {"path": path}}
    doc["params"]["content"] = "c"
    target = tmp_path / "request.json"
    target.write_text(json.dumps(doc))
    return target


def test_a_deadline_that_would_apply_does_not_pass_a_kill_switch(
    tmp_path: Path, home: Path
) -> None:
    """on_timeout = "approve" applies a reversible request when nobody decides; not once
    its effect is switched off. The deadline passes when the test moves the broker's
    clock, after the CLI has switched the effect off (whether or not its nudge came)."""
    policy = (
        '[[rules]]\neffect = "files.write"\naction = "approve"\ntimeout = "2s"\n'
        'on_timeout = "approve"\nreason = "a person may look; else it goes"\n'
    )
    exports = tmp_path / "exports"
    exports.mkdir()
    clock = FakeClock()
    h = BrokerHarness(
        tmp_path / "b",
        policy=policy,
        integrations={"files": {"root": str(exports)}},
        clock=clock,
    )
    (tmp_path / "policy.toml").write_text(policy)
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[broker]\nstate_dir = "{h.state}"\npolicy = "policy.toml"\n'
        f'[integrations.files]\nroot = "{exports}"\n'
    )

    def cli(*args: str) -> None:
        done = run_broker(*args, "--config", str(config), home=home)
        assert done.returncode == 0, done.stderr

    def late(path: str) -> dict[str, object]:
        doc = h.request("files.write", {"path": path, "content": "x"})
        return h.submit(doc, terminal=False)

    with h:
        rid = str(late("late.txt")["id"])
        assert h.wait(rid, terminal=False)["status"] == "pending"
        cli("effects", "disable", "files.write", "--reason", "frozen for the audit")
        clock.advance(2.0)
        done = h.wait(rid)
        assert done["status"] == "denied"
        assert "frozen for the audit" in done["reason"]
        assert not any(exports.rglob("late.txt"))
        cli("effects", "enable", "files.write")
        assert h.broker is not None
        controls = h.broker.admission.controls
        eventually(lambda: controls.disabled("files.write") is None)  # the nudge came
        other = str(late("later.txt")["id"])
        assert h.wait(other, terminal=False)["status"] == "pending"
        clock.advance(2.0)
        applied = h.wait(other)
        assert applied["status"] == "applied"
        assert applied["decided_by"] == "policy (on_timeout)"
