"""The audit log's hash chain: appends, tamper detection with line numbers, crash recovery."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from broker.audit.log import GENESIS, AuditLog, line_hash
from broker.audit.verify import read_events, verify


def events(first: int, last: int) -> list[tuple[int, dict[str, Any]]]:
    """Queued events with seq first..last, as the ledger hands them over."""
    return [
        (seq, {"at": f"2026-01-01T00:00:{seq:02d}.000Z", "event": "received", "id": f"r{seq}"})
        for seq in range(first, last + 1)
    ]


@pytest.fixture
def log(tmp_path: Path) -> AuditLog:
    """An audit log holding five chained events."""
    audit = AuditLog(tmp_path / "state" / "audit.jsonl")
    audit.append(events(1, 5))
    return audit


def lines_of(log: AuditLog) -> list[str]:
    """The log's lines, each with its newline."""
    return log.path.read_text().splitlines(keepends=True)


def rewrite(log: AuditLog, lines: list[str]) -> None:
    """Replace the log's content, as someone with write access to it could."""
    log.path.write_text("".join(lines))


def test_appended_chain_verifies(log: AuditLog) -> None:
    """Five appended events verify, with and without the ledger's expected head."""
    assert verify(log.path) == (5, None)
    assert verify(log.path, expected_head=(5, log.head)) == (5, None)


def test_lines_are_chained(log: AuditLog) -> None:
    """Each line carries seq, the previous line's hash and its own hash."""
    entries = [json.loads(line) for line in lines_of(log)]
    assert [e["seq"] for e in entries] == [1, 2, 3, 4, 5]
    assert entries[0]["prev"] == GENESIS
    for before, after in itertools.pairwise(entries):
        assert after["prev"] == before["hash"]
    assert all(e["hash"] == line_hash(e) for e in entries)
    assert entries[-1]["hash"] == log.head
    assert log.last_seq == 5


def test_edited_line_is_detected(log: AuditLog) -> None:
    """Changing one field of line 3 is reported at line 3 as an edit."""
    lines = lines_of(log)
    entry = json.loads(lines[2])
    entry["id"] = "someone-else"
    lines[2] = json.dumps(entry) + "\n"
    rewrite(log, lines)
    _, fault = verify(log.path)
    assert fault is not None
    assert fault.line == 3
    assert "edited" in fault.problem


def test_edited_line_with_recomputed_hash_is_detected(log: AuditLog) -> None:
    """An edit whose own hash is recomputed still breaks the next line, line 4."""
    lines = lines_of(log)
    entry = json.loads(lines[2])
    entry["event"] = "denied"
    entry["hash"] = line_hash(entry)
    lines[2] = json.dumps(entry) + "\n"
    rewrite(log, lines)
    _, fault = verify(log.path)
    assert fault is not None and fault.line == 4


def test_damaged_line_is_detected(log: AuditLog) -> None:
    """A line that is no longer JSON is reported at its line number."""
    lines = lines_of(log)
    lines[1] = lines[1][:40] + "\n"
    rewrite(log, lines)
    _, fault = verify(log.path)
    assert fault is not None and fault.line == 2


def test_deleted_middle_line_is_detected(log: AuditLog) -> None:
    """Removing line 3 is reported at line 3, where the chain no longer holds."""
    lines = lines_of(log)
    del lines[2]
    rewrite(log, lines)
    _, fault = verify(log.path)
    assert fault is not None
    assert fault.line == 3
    assert "removed" in fault.problem


def test_deleted_first_line_is_detected(log: AuditLog) -> None:
    """Removing line 1 is reported at line 1."""
    rewrite(log, lines_of(log)[1:])
    _, fault = verify(log.path)
    assert fault is not None and fault.line == 1


def test_swapped_lines_are_detected(log: AuditLog) -> None:
    """Swapping lines 2 and 3 is reported at line 2."""
    lines = lines_of(log)
    lines[1], lines[2] = lines[2], lines[1]
    rewrite(log, lines)
    _, fault = verify(log.path)
    assert fault is not None and fault.line == 2


def test_deleted_last_line_is_detected_with_expected_head(log: AuditLog) -> None:
    """Cutting the last line is reported, at line 5, when the ledger's head is given."""
    head = (5, log.head)
    rewrite(log, lines_of(log)[:-1])
    count, fault = verify(log.path, expected_head=head)
    assert count == 4
    assert fault is not None
    assert fault.line == 5
    assert "event 5" in fault.problem


def test_deleted_log_is_detected_with_expected_head(log: AuditLog) -> None:
    """A log removed entirely is reported when the ledger says events were appended."""
    head = (5, log.head)
    log.path.unlink()
    _, fault = verify(log.path, expected_head=head)
    assert fault is not None and fault.line == 1


def test_forged_line_inserted_is_detected(log: AuditLog) -> None:
    """A forged event inserted after line 2 is reported at line 3."""
    lines = lines_of(log)
    forged = {"at": "2026-01-01T00:00:02.500Z", "event": "applied", "id": "r2", "seq": 3}
    forged["prev"] = GENESIS
    forged["hash"] = line_hash(forged)
    lines.insert(2, json.dumps(forged) + "\n")
    rewrite(log, lines)
    _, fault = verify(log.path)
    assert fault is not None and fault.line == 3


def test_forged_line_chained_onto_previous_is_detected(log: AuditLog) -> None:
    """A forged line that chains onto line 2 correctly is still caught by its seq at line 3."""
    lines = lines_of(log)
    forged: dict[str, Any] = {"at": "x", "event": "applied", "id": "r2", "seq": 2}
    forged["prev"] = json.loads(lines[1])["hash"]
    forged["hash"] = line_hash(forged)
    lines.insert(2, json.dumps(forged) + "\n")
    rewrite(log, lines)
    _, fault = verify(log.path)
    assert fault is not None and fault.line == 3


def test_torn_last_line_is_dropped_and_chain_continues(log: AuditLog) -> None:
    """A half-written last line (no newline) is dropped on open; appends chain on."""
    head = log.head
    with log.path.open("a") as f:
        f.write('{"seq": 6, "event": "rece')
    reopened = AuditLog(log.path)
    assert (reopened.last_seq, reopened.head) == (5, head)
    assert len(lines_of(log)) == 5
    reopened.append(events(6, 7))
    assert verify(log.path, expected_head=(7, reopened.head)) == (7, None)
    assert [json.loads(line)["seq"] for line in lines_of(log)] == [1, 2, 3, 4, 5, 6, 7]


def test_torn_long_last_line_keeps_earlier_lines(log: AuditLog) -> None:
    """A torn last line longer than any read-back window drops only itself."""
    with log.path.open("a") as f:
        f.write('{"seq": 6, "reason": "' + "x" * 300_000)
    reopened = AuditLog(log.path)
    assert reopened.last_seq == 5
    assert verify(log.path) == (5, None)


def test_long_last_line_is_read_back(tmp_path: Path) -> None:
    """An event larger than 64 KiB as the last line does not stop the log from opening."""
    audit = AuditLog(tmp_path / "audit.jsonl")
    audit.append(events(1, 2))
    audit.append([(3, {"event": "invalid", "errors": ["/params/" + "k" * 200_000]})])
    reopened = AuditLog(audit.path)
    assert (reopened.last_seq, reopened.head) == (3, audit.head)
    reopened.append(events(4, 4))
    assert verify(audit.path) == (4, None)


def test_replayed_events_are_not_appended_twice(log: AuditLog) -> None:
    """After a crash the ledger hands over events 4..7 again; only 6 and 7 are added."""
    reopened = AuditLog(log.path)
    last = reopened.append(events(4, 7))
    assert last == 7
    assert [json.loads(line)["seq"] for line in lines_of(log)] == [1, 2, 3, 4, 5, 6, 7]
    assert verify(log.path) == (7, None)


def test_append_of_only_known_events_writes_nothing(log: AuditLog) -> None:
    """Appending events the log already holds leaves the file as it was."""
    before = log.path.read_bytes()
    assert log.append(events(1, 5)) == 5
    assert log.path.read_bytes() == before


def test_two_writers_keep_one_chain(tmp_path: Path) -> None:
    """Two AuditLog objects on one file (broker and a CLI decision) never fork the chain."""
    path = tmp_path / "audit.jsonl"
    broker_side, cli_side = AuditLog(path), AuditLog(path)
    broker_side.append(events(1, 2))
    cli_side.append(events(3, 3))
    broker_side.append(events(4, 5))
    assert verify(path, expected_head=(5, broker_side.head)) == (5, None)


def test_new_log_starts_at_genesis(tmp_path: Path) -> None:
    """A fresh log has no head yet and its first line points at the genesis hash."""
    audit = AuditLog(tmp_path / "new" / "audit.jsonl")
    assert (audit.last_seq, audit.head) == (0, GENESIS)
    audit.append(events(1, 1))
    assert json.loads(lines_of(audit)[0])["prev"] == GENESIS


def test_read_events_numbers_lines_and_flags_damage(log: AuditLog) -> None:
    """read_events yields line numbers from 1, and None for a line that is not JSON."""
    lines = lines_of(log)
    lines[3] = "not json\n"
    rewrite(log, lines)
    read = list(read_events(log.path))
    assert [number for number, _, _ in read] == [1, 2, 3, 4, 5]
    assert read[3][1] is None and read[3][2] == "not json"
    assert read[0][1] is not None and read[0][1]["seq"] == 1


def test_the_keyed_start_refuses_unkeyed_lines_and_a_cut_before_it(tmp_path: Path) -> None:
    """Three unkeyed lines, then a key: the ledger's signed record says lines are keyed
    from event 4. Verified under it: intact; unkeyed from event 4 on, or cut to three
    lines, or a record moved back to event 1 without the key: each a fault."""
    from broker.audit.log import keyed_mark
    from broker.audit.verify import check

    key = b"k" * 32
    path = tmp_path / "audit.jsonl"
    AuditLog(path).append(events(1, 3))
    AuditLog(path, key).append(events(4, 6))
    start = (4, keyed_mark(key, 4))
    assert check(path, None, key, start).fault is None
    plain = tmp_path / "plain.jsonl"
    AuditLog(plain).append(events(1, 6))
    fault = check(plain, None, key, start).fault
    assert fault is not None and fault.line == 4 and "re-chained without the key" in fault.problem
    AuditLog(tmp_path / "short.jsonl").append(events(1, 3))
    cut = check(tmp_path / "short.jsonl", None, key, start).fault
    assert cut is not None and "ends before event 4" in cut.problem
    moved = check(path, None, key, (1, keyed_mark(b"x" * 32, 1))).fault
    assert moved is not None and "not signed by this audit key" in moved.problem
