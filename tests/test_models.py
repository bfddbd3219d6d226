"""The records on the data path: frozen, with JSON forms that survive a round trip."""

from __future__ import annotations

import dataclasses

import pytest

from broker.models import Preview, Record, Request, Result, Verdict, canonical_json, sha256_hex


def test_request_round_trip_and_its_hash() -> None:
    """A Request survives to_json/from_json; its sha256 covers the canonical envelope."""
    req = Request("sb", "r1", "r1", "files.write", {"path": "a", "n": 1}, "why", "k", {"b": "d"})
    again = Request.from_json(req.to_json())
    assert again == req and again.sha256 == req.sha256
    assert req.sha256 == sha256_hex(canonical_json(req.envelope()))
    assert Request("sb", "r1", "r1", "files.write", {"path": "b"}).sha256 != req.sha256


def test_result_round_trip_shows_pending_terms_only_while_pending() -> None:
    """expires_at/on_timeout appear in a pending result, not a terminal one."""
    pending = Result("r1", "pending", expires_at="t", on_timeout="deny", errors=({"a": "b"},))
    assert Result.from_json(pending.to_json()) == pending
    assert "expires_at" in pending.to_json()
    done = dataclasses.replace(pending, status="applied")
    assert "expires_at" not in done.to_json() and done.terminal


def test_verdict_and_preview_round_trip() -> None:
    """Verdicts and previews read back as they were written."""
    verdict = Verdict("approve", "rules[2]", "why", 2, 90.0, "approve")
    assert Verdict.from_json(verdict.to_json()) == verdict
    preview = Preview("t", "target", "body", "diff", (("k", "v"),))
    assert Preview.from_json(preview.to_json()) == preview


def test_records_are_frozen_and_evolve_checks_names() -> None:
    """A Record cannot be changed in place; evolve refuses unknown fields."""
    record = Record("sb", "r1", "r1", "received", "t", payload='{"params": {"a": 1}}')
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.state = "applied"  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field 'colour'"):
        record.evolve(colour="red")
    changed = record.evolve(payload='{"params": {"a": 2}}')
    assert record.envelope["params"] == {"a": 1} and changed.envelope["params"] == {"a": 2}


def test_a_record_shows_a_result_only_once_there_is_one() -> None:
    """received/applying rows have no result file; pending and terminal rows do."""
    record = Record("sb", "r1", "r1", "received", "t")
    assert record.result() is None and record.evolve(state="applying").result() is None
    assert record.evolve(state="pending").result() is not None
    assert record.evolve(state="denied", replay_of="r0").result().to_json()["replayed"] is True  # type: ignore[union-attr]
