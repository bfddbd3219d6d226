"""Reading the audit log back and checking its chain: the first line where it does not
hold, and why.

A keyed log is checked under the host's key. The ledger's signed record of the event
from which every line is keyed (`broker.audit.log.remember_keyed`) is what keeps a log
from being "unkeyed": an unkeyed line at or after that event is a fault whatever the
line's own marks say, as is a log that ends before it.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.audit.log import GENESIS, KEYED, keyed_mark, line_hash

CHECKPOINTS_HINT = (
    "`broker audit verify --checkpoints FILE` (the checkpoints exported off the host) "
    "shows which lines they still vouch for"
)


@dataclass(frozen=True)
class Fault:
    """The first place where the chain does not hold."""

    line: int
    problem: str


def read_events(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
    """(line number, parsed event or None, raw text) for each line of the log."""
    if not path.exists():
        return
    with path.open("r", encoding="utf-8", errors="replace") as f:
        yield from parse_lines(raw.rstrip("\n") for raw in f)


def parse_lines(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
    """(line number, parsed event or None, raw text) for each line of a chain."""
    for number, text in enumerate(lines, 1):
        try:
            value = json.loads(text)
        except ValueError:
            yield number, None, text
            continue
        yield number, value if isinstance(value, dict) else None, text


@dataclass(frozen=True)
class Report:
    """What `check` found: lines checked, the first fault, how many lines (from the
    start) carry only a sha256 chain (written before a key was configured)."""

    count: int
    fault: Fault | None
    unkeyed: int = 0
    hashes: dict[int, str] = field(default_factory=dict)


def verify(path: Path, expected_head: tuple[int, str] | None = None) -> tuple[int, Fault | None]:
    """Check the whole chain of an unkeyed log: (lines checked, first fault or None)."""
    report = check(path, expected_head)
    return report.count, report.fault


def verify_lines(
    lines: Iterable[tuple[int, dict[str, Any] | None, str]],
    expected_head: tuple[int, str] | None = None,
    key: bytes | None = None,
) -> tuple[int, Fault | None]:
    """`verify` over (line number, parsed event or None, raw text) from any source."""
    report = check_lines(lines, expected_head, key)
    return report.count, report.fault


def check(
    path: Path,
    expected_head: tuple[int, str] | None = None,
    key: bytes | None = None,
    keyed_from: tuple[int, str] | None = None,
) -> Report:
    """The log file's chain, checked (`check_lines`)."""
    return check_lines(read_events(path), expected_head, key, keyed_from)


def keyed_from_fault(keyed_from: tuple[int, str] | None, key: bytes | None) -> Fault | None:
    """Whether the ledger's record of where keying began is one `key` signed."""
    if keyed_from is None:
        return None
    seq, mac = keyed_from
    if key is None:
        return Fault(
            0,
            f"the ledger records every line from event {seq} as keyed and no audit key was "
            "given: verify with the host's [audit] key_env or key_file",
        )
    if not hmac.compare_digest(mac, keyed_mark(key, seq)):
        return Fault(
            0,
            "the ledger's record of where the keyed lines begin is not signed by this "
            f"audit key: it was forged or the key is not the one that wrote it; {CHECKPOINTS_HINT}",
        )
    return None


def check_lines(
    lines: Iterable[tuple[int, dict[str, Any] | None, str]],
    expected_head: tuple[int, str] | None = None,
    key: bytes | None = None,
    keyed_from: tuple[int, str] | None = None,
) -> Report:
    """Check a whole chain, keyed lines under `key`.

    `expected_head` is the (seq, hash) the ledger last saw appended; a log cut short
    before it is reported too. A keyed line without the key, a key that does not match,
    and an unkeyed line after a keyed one (appended by someone without the key) are
    faults. `keyed_from` is the ledger's signed record (seq, mac) of the first keyed
    event: an unkeyed line from there on, or a log ending before it, is a fault.
    """
    fault = keyed_from_fault(keyed_from, key)
    if fault is not None:
        return Report(0, fault)
    must_key = keyed_from[0] if keyed_from else None
    prev, last_seq, count, seen_head = GENESIS, 0, 0, expected_head is None
    unkeyed, keyed_seen = 0, False
    hashes: dict[int, str] = {}
    for number, entry, _raw in lines:
        count = number
        fault = _line_fault(number, entry, prev, last_seq, key, keyed_seen)
        if fault is None and must_key is not None:
            fault = _downgraded(number, entry, must_key)
        if fault is not None:
            return Report(count, fault, unkeyed, hashes)
        assert entry is not None
        keyed_seen = keyed_seen or entry.get("alg") == KEYED
        unkeyed += 0 if keyed_seen else 1
        prev, last_seq = str(entry["hash"]), int(entry["seq"])
        hashes[last_seq] = prev
        if expected_head and (last_seq, prev) == expected_head:
            seen_head = True
    if must_key is not None and last_seq < must_key:
        fault = Fault(
            count + 1,
            f"the log ends before event {must_key}, from which the ledger records every line "
            f"as keyed: lines were removed from the end; {CHECKPOINTS_HINT}",
        )
        return Report(count, fault, unkeyed, hashes)
    if not seen_head and expected_head is not None:
        fault = Fault(
            count + 1,
            f"the log ends before event {expected_head[0]}, which the ledger recorded as "
            "appended: lines were removed from the end",
        )
        return Report(count, fault, unkeyed, hashes)
    return Report(count, None, unkeyed, hashes)


def _downgraded(number: int, entry: dict[str, Any] | None, must_key: int) -> Fault | None:
    assert entry is not None
    if entry.get("alg") == KEYED or int(entry["seq"]) < must_key:
        return None
    return Fault(
        number,
        f"an unkeyed line where the ledger records every line from event {must_key} as "
        f"keyed under the audit key: the log was re-chained without the key; {CHECKPOINTS_HINT}",
    )


def _line_fault(
    number: int,
    entry: dict[str, Any] | None,
    prev: str,
    last_seq: int,
    key: bytes | None,
    keyed_seen: bool,
) -> Fault | None:
    if entry is None:
        return Fault(number, "not a JSON object: the line was edited or damaged")
    if entry.get("prev") != prev:
        return Fault(
            number,
            "its prev hash does not match the line before: a line was removed, "
            "inserted or moved here",
        )
    keyed = entry.get("alg") == KEYED
    if keyed and key is None:
        return Fault(
            number,
            "the line is keyed (hmac-sha256) and no audit key was given: verify with the "
            "host's [audit] key_env or key_file",
        )
    if keyed_seen and not keyed:
        return Fault(
            number,
            "an unkeyed line after keyed ones: it was appended by someone without the audit key",
        )
    if entry.get("hash") != line_hash(entry, key):
        what = "or the key is not the one that wrote it" if keyed else ""
        return Fault(
            number, f"its content does not match its hash: the line was edited {what}".strip()
        )
    seq = entry.get("seq")
    if not isinstance(seq, int) or seq <= last_seq:
        return Fault(number, "its sequence number goes backwards: lines were reordered")
    return None
