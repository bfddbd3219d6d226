"""Staged mode through a real broker: every request validated, classified and previewed,
answered `staged` with the verdict and the preview, and nothing applied; per-effect
staging; idempotency keys and restarts; `broker stats`. (Every built-in effect against
its real server: tests/effects/test_staged.py; the web inbox: tests/web/test_staged.py.)"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from broker.config import Limits, load_config
from broker.errors import ConfigError
from broker.models import Preview
from broker.staged import EVERY, Staged
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, FakeHandler
from effects.base import Context
from tests.support import ServeSite, assert_one_line_error, checked, run_broker
from tests.test_stats import stats_cli

POLICY = """
[[rules]]
effect = "test.record"
when = { value = "gate*" }
action = "approve"
approvals = 2
timeout = "2h"
reason = "gated values are read by two people"

[[rules]]
effect = "test.record"
when = { value = "no*" }
action = "deny"
reason = "no-values are never recorded; send another value"
"""


class SlowPreview(FakeHandler):
    """test.slow: a preview that waits for `go` (or fails, with `broken`)."""

    def __init__(self) -> None:
        super().__init__("test.slow")
        self.go = threading.Event()
        self.asked = threading.Event()
        self.broken = False

    def preview(self, params: Any, ctx: Context) -> Preview:
        self.asked.set()
        self.go.wait(20)
        if self.broken:
            raise RuntimeError("the preview's service broke")
        return super().preview(params, ctx)


def harness(base: Path, *handlers: Any, staged: Staged | bool = True, **kw: Any) -> BrokerHarness:
    names = {h.name for h in handlers}
    policy = POLICY if "test.record" in names else None
    return BrokerHarness(base, handlers=handlers, policy=policy, staged=staged, **kw)


def staged(result: dict[str, Any], action: str, rule: str) -> dict[str, Any]:
    """`result` is a schema-valid staged result whose verdict is `action` by `rule`."""
    checked(result)
    assert result["status"] == "staged", result
    out = result["output"]
    assert out["staged"] is True and out["verdict"]["action"] == action, out
    assert out["verdict"]["rule"] == rule
    assert "nothing was applied" in result["reason"]
    assert result["decided_by"] is None
    return out


# -- the verdicts, the preview, nothing applied ------------------------------------------


def test_every_verdict_is_staged_with_its_preview_and_nothing_is_applied(tmp_path: Path) -> None:
    """auto, approve and deny are all answered staged, each with the literal preview."""
    fake = FakeHandler("test.record")
    with harness(tmp_path / "h", fake) as h:
        auto = h.submit(h.request("test.record", {"value": "plain"}))
        gated = h.submit(h.request("test.record", {"value": "gated"}))
        refused = h.submit(h.request("test.record", {"value": "nope"}))
    out = staged(auto, "auto", "default")
    assert out["preview"]["title"] == "record 'plain'"
    assert json.loads(out["preview"]["body"]) == {"value": "plain"}
    out = staged(gated, "approve", "rules[0]")
    assert (out["verdict"]["approvals"], out["verdict"]["timeout_s"]) == (2, 7200.0)
    assert out["preview"]["title"] == "record 'gated'"
    assert "wait for 2 approval(s)" in gated["reason"]
    out = staged(refused, "deny", "rules[1]")
    assert out["preview"]["title"] == "record 'nope'"
    assert "would deny it" in refused["reason"]
    assert fake.applied == []
    ledger = Ledger(h.config.ledger_path)
    try:
        assert {r.state for r in ledger.all()} == {"staged"}
    finally:
        ledger.close()
    events = [json.loads(line)["event"] for line in h.config.audit_path.read_text().splitlines()]
    assert events.count("staged") == 3
    assert not {"applying", "applied", "pending", "denied"} & set(events)


def test_an_invalid_request_is_still_invalid(tmp_path: Path) -> None:
    """Validation is real in staged mode: a schema violation is `invalid`, not staged."""
    fake = FakeHandler("test.record")
    with harness(tmp_path / "h", fake) as h:
        result = h.submit(h.request("test.record", {"value": "x", "extra": 1}))
        unknown = h.submit(h.request("test.recrod", {"value": "x"}))
    assert result["status"] == "invalid" and result["errors"], result
    assert unknown["status"] == "invalid"
    assert fake.applied == []


def test_staged_requests_never_wait_nor_count_against_the_pending_cap(tmp_path: Path) -> None:
    """With a cap of 1 waiting request, three would-be approvals are all staged."""
    fake = FakeHandler("test.record")
    with harness(tmp_path / "h", fake, limits=Limits(max_pending_per_sandbox=1)) as h:
        results = [h.submit(h.request("test.record", {"value": f"gate{i}"})) for i in range(3)]
    for result in results:
        staged(result, "approve", "rules[0]")
    assert fake.applied == []


def test_a_preview_that_breaks_or_times_out_gives_the_no_preview_card(tmp_path: Path) -> None:
    """The card says why there is no preview; the request is staged, never applied."""
    slow = SlowPreview()
    h = harness(tmp_path / "h", slow)
    h.config = h.config._replace(preview_timeout_s=0.5)
    with h:
        late = h.submit(h.request("test.slow", {"value": "late"}), timeout=15)
        slow.broken = True
        slow.go.set()
        broken = h.submit(h.request("test.slow", {"value": "broken"}))
    out = staged(late, "auto", "default")
    assert out["preview"]["title"] == "the preview could not be computed"
    assert "did not answer within 0.5s" in out["preview"]["body"]
    out = staged(broken, "auto", "default")
    assert out["preview"]["title"] == "the preview could not be computed"
    assert slow.applied == []


# -- per effect ------------------------------------------------------------------------


def test_per_effect_staging_stages_only_the_listed_effects(tmp_path: Path) -> None:
    """staged = ["test.rec*"]: test.record is staged, test.other is applied as usual."""
    record, other = FakeHandler("test.record"), FakeHandler("test.other")
    with harness(tmp_path / "h", record, other, staged=Staged(("test.rec*",))) as h:
        a = h.submit(h.request("test.record", {"value": "plain"}))
        b = h.submit(h.request("test.other", {"value": "plain"}))
    staged(a, "auto", "default")
    assert b["status"] == "applied", b
    assert record.applied == [] and other.applied == [{"value": "plain"}]


# -- idempotency keys and restarts -----------------------------------------------------


def test_a_key_replays_staged_while_staged_and_applies_once_after(tmp_path: Path) -> None:
    """Staged: the same key is replayed as staged. Staging off: the first real request
    with that key applies, and the next one is a replay of it, not a second apply."""
    fake = FakeHandler("test.record")
    h = harness(tmp_path / "h", fake)
    with h:
        first = h.submit(h.request("test.record", {"value": "v"}, idempotency_key="k1"))
        again = h.submit(h.request("test.record", {"value": "v"}, idempotency_key="k1"))
    staged(first, "auto", "default")
    assert again["status"] == "staged" and again.get("replayed") is True
    h.config = h.config._replace(staged=Staged())
    with h:
        real = h.submit(h.request("test.record", {"value": "v"}, idempotency_key="k1"))
        replay = h.submit(h.request("test.record", {"value": "v"}, idempotency_key="k1"))
    assert real["status"] == "applied" and not real.get("replayed"), real
    assert replay["status"] == "applied" and replay.get("replayed") is True
    assert fake.applied == [{"value": "v"}]
    kept = json.loads((h.results / f"{first['id']}.json").read_text())
    assert kept["status"] == "staged"  # what was staged stays staged


def test_a_request_held_for_its_preview_at_a_restart_is_staged_after_it(tmp_path: Path) -> None:
    """Stopped while its preview runs: the next start assesses it again and stages it."""
    slow = SlowPreview()
    h = harness(tmp_path / "h", slow)
    with h:
        doc = h.request("test.slow", {"value": "held"})
        h.write(f"{doc['id']}.json", doc)
        assert slow.asked.wait(10)
    ledger = Ledger(h.config.ledger_path)
    try:
        held = ledger.get("default", doc["id"])
        assert held is not None and held.state == "received"
    finally:
        ledger.close()
    slow.go.set()
    with h:
        result = h.wait(doc["id"], timeout=15)
    out = staged(result, "auto", "default")
    assert out["preview"]["title"] == "record 'held'"
    assert slow.applied == []


def test_staged_results_stay_staged_after_a_restart_without_staged_mode(tmp_path: Path) -> None:
    """The ledger row and the result file keep `staged`; a lost result file comes back
    as `staged`; nothing is applied when staging is turned off."""
    fake = FakeHandler("test.record")
    h = harness(tmp_path / "h", fake)
    with h:
        result = h.submit(h.request("test.record", {"value": "plain"}))
    (h.results / f"{result['id']}.json").unlink()  # lost, as after a power cut
    h.config = h.config._replace(staged=Staged())
    with h:
        back = h.wait(result["id"])
    assert back["status"] == "staged" and back["output"] == result["output"]
    assert fake.applied == []


# -- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", EVERY), ("false", Staged()), ('["github.*", "s3.put_object"]', None)],
)
def test_broker_staged_reads_true_false_or_globs(
    tmp_path: Path, value: str, expected: Staged | None
) -> None:
    """`[broker] staged` is true, false or a list of effect globs."""
    path = tmp_path / "broker.toml"
    path.write_text(f"[broker]\nstaged = {value}\n")
    cfg = load_config(path)
    if expected is None:
        assert cfg.staged.covers("github.issue.create") and cfg.staged.covers("s3.put_object")
        assert not cfg.staged.covers("s3.delete_object")
    else:
        assert cfg.staged == expected


@pytest.mark.parametrize("value", ['"yes"', "[]", '["files.*", 3]', '[""]', "1"])
def test_a_bad_staged_value_is_one_clear_error(tmp_path: Path, value: str) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(f"[broker]\nstaged = {value}\n")
    with pytest.raises(ConfigError, match=r"broker\.staged: expected true, false or a list"):
        load_config(path)


def test_serve_refuses_a_bad_staged_value_or_a_glob_naming_no_effect(
    tmp_path: Path, home: Path
) -> None:
    """One line on stderr, no traceback, naming the key (and the glob)."""
    site = ServeSite(tmp_path / "bad", home, "")
    text = site.config.read_text().replace("[broker]\n", '[broker]\nstaged = "all"\n')
    site.config.write_text(text)
    proc = run_broker("serve", "--config", str(site.config), home=home)
    assert_one_line_error(proc, "broker.staged", "expected true, false")
    site.config.write_text(text.replace('staged = "all"', 'staged = ["githb.*"]'))
    proc = run_broker("serve", "--config", str(site.config), home=home)
    assert_one_line_error(proc, "broker.staged", "'githb.*' matches no registered effect")


# -- broker stats --------------------------------------------------------------------------


def test_broker_stats_counts_staged_requests(tmp_path: Path, exports: Path) -> None:
    """`broker stats` has a staged column once anything was staged; --json counts it."""
    fake = FakeHandler("test.record")
    h = harness(
        tmp_path / "h",
        fake,
        staged=Staged(("files.*",)),
        integrations={"files": {"root": str(exports)}},
    )
    with h:
        for name in ("a.txt", "b.txt"):
            h.submit(h.request("files.write", {"path": name, "content": "x"}))
        h.submit(h.request("test.record", {"value": "plain"}))
    summary = json.loads(stats_cli(h.state, "--json").stdout)
    assert summary["effects"]["files.write"]["counts"]["staged"] == 2
    assert summary["effects"]["files.write"]["counts"]["auto"] == 0
    assert summary["effects"]["test.record"]["counts"]["auto"] == 1
    assert summary["overall"]["counts"]["staged"] == 2
    table = [line.split("\t") for line in stats_cli(h.state, "--tsv").stdout.splitlines()]
    row = dict(zip(table[0], next(r for r in table if r[0] == "files.write"), strict=True))
    assert row["staged"] == "2" and row["auto"] == "0"
    assert "staged" in stats_cli(h.state).stdout.splitlines()[0]  # the table's header too
    assert list(exports.rglob("*.txt")) == []
