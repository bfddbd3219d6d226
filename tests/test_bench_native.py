"""The native accept-path prototype (bench/native) does what its figures claim: the
broker's results, rows and sha256 chain for bench.noop, and refusals for what the
strict reader refuses. Skipped where it cannot be built (scripts/native-deps.sh)."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from bench import cases, writer
from broker.audit.verify import verify
from broker.models import canonical_json, sha256_hex


@pytest.fixture
def native(tmp_path: Path) -> Iterator[cases.Live]:
    """The prototype serving one outbox in a fresh cell (stopped by the test to read
    what it left, and again here whatever happened)."""
    try:
        live = cases.start_native(cases.Cells(tmp_path))
    except RuntimeError as exc:
        pytest.skip(str(exc))
    with live:
        yield live


def _drop(outbox: str, name: str, body: bytes) -> None:
    tmp = os.path.join(outbox, f".{name}.tmp")
    Path(tmp).write_bytes(body)
    os.rename(tmp, os.path.join(outbox, name))


def _wait(results: str, names: list[str], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(results, n)) for n in names):
        assert time.monotonic() < end, f"no result for some of {names}"
        time.sleep(0.02)


def test_applies_records_and_chains(native: cases.Live) -> None:
    """Sequential bench.noop requests: applied results, one row each, the same sha256 as
    the broker's canonical envelope, and an audit chain the broker's verify accepts."""
    with native:
        ((outbox, results),) = native.boxes
        writer.sequential(native.boxes, 20, writer._effect_doc("bench.noop"), "s")
        _drop(outbox, "noid.json", b'{"version": 1, "effect": "bench.noop", "params": {}}')
        _wait(results, ["noid.json"])
    state = native.cell / "state"
    first = json.loads(Path(results, "s0.json").read_text())
    envelope = {"version": 1, "id": "s0", "effect": "bench.noop", "params": {}}
    assert first["status"] == "applied"
    assert first["request_sha256"] == sha256_hex(canonical_json(envelope))
    noid = json.loads(Path(results, "noid.json").read_text())
    envelope["id"] = "noid"
    assert noid["request_sha256"] == sha256_hex(canonical_json(envelope))
    lines, fault = verify(state / "audit.jsonl")
    assert (lines, fault) == (21 * 4, None)
    with closing(sqlite3.connect(state / "ledger.sqlite3")) as db:
        rows = db.execute("SELECT count(*), min(state), max(state) FROM requests").fetchone()
        assert rows == (21, "applied", "applied")
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"version":1,"effect":"bench.noop","params":{},"params":{}}', "duplicate_key"),
        (b'\xef\xbb\xbf{"version":1,"effect":"bench.noop","params":{}}', "bad_json"),
        (b'{"version":1,"effect":"bench.noop","params":{"v":NaN}}', "non_finite_number"),
        (b'{"version":1,"effect":"bench.noop","params":{"v":"\\ud800"}}', "bad_unicode"),
        (b'{"version":1,"effect":"bench.noop","params":{}} \xff', "bad_utf8"),
        (b'{"version":3,"effect":"bench.noop","params":{}}', "enum"),
        (b'{"version":1,"effect":"bench.noop","params":{},"x":1}', "additionalProperties"),
        (b'{"version":1,"effect":"bench.noop","params":{"value":1.5}}', "type"),
        (b"[" * 70 + b"]" * 70, "too_deep"),
    ],
)
def test_refuses(native: cases.Live, body: bytes, code: str) -> None:
    """What the strict reader or the envelope refuses gets an `invalid` result naming why."""
    with native:
        ((outbox, results),) = native.boxes
        _drop(outbox, "bad.json", body)
        _wait(results, ["bad.json"])
    found = json.loads(Path(results, "bad.json").read_text())
    assert (found["status"], found["errors"][0]["code"]) == ("invalid", code)
