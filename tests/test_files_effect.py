"""files.write through a real broker: below the export root, never outside it."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness
from tests.support import SETTLE_S, checked


@contextmanager
def running(h: BrokerHarness) -> Iterator[BrokerHarness]:
    h.start()
    time.sleep(SETTLE_S)
    try:
        yield h
    finally:
        h.stop()


@pytest.fixture
def exports(tmp_path: Path) -> Path:
    """Where the harness's sandbox (`default`) writes: its own directory below the root."""
    mine = tmp_path / "exports" / "default"
    mine.mkdir(parents=True)
    return mine


@pytest.fixture
def broker(tmp_path: Path, exports: Path) -> Iterator[BrokerHarness]:
    """A running broker with files.write rooted at `exports`' parent, default policy."""
    with running(
        BrokerHarness(tmp_path / "b", integrations={"files": {"root": str(exports.parent)}})
    ) as h:
        yield h


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A directory outside the export root, which nothing may reach."""
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path


def write(h: BrokerHarness, path: str, content: str, **params: Any) -> dict[str, Any]:
    doc = h.request("files.write", {"path": path, "content": content, **params})
    return checked(h.submit(doc))


def test_writes_below_the_root_creating_directories(broker: BrokerHarness, exports: Path) -> None:
    """A new file in new subdirectories is written and described in the output."""
    result = write(broker, "reports/2026/q1.txt", "totals\n")
    assert result["status"] == "applied"
    assert (exports / "reports" / "2026" / "q1.txt").read_text() == "totals\n"
    assert result["output"] == {
        "path": "reports/2026/q1.txt",
        "bytes": 7,
        "sha256": hashlib.sha256(b"totals\n").hexdigest(),
        "created": True,
        "changed": True,
    }
    assert [p.name for p in exports.rglob("*")] == ["reports", "2026", "q1.txt"]


def test_same_content_twice_is_applied_without_change(broker: BrokerHarness, exports: Path) -> None:
    """Writing what is already there succeeds again and says nothing changed."""
    first = write(broker, "a.txt", "same\n")
    second = write(broker, "a.txt", "same\n")
    assert first["status"] == second["status"] == "applied"
    assert (first["output"]["created"], first["output"]["changed"]) == (True, True)
    assert (second["output"]["created"], second["output"]["changed"]) == (False, False)
    assert (exports / "a.txt").read_text() == "same\n"


def test_other_content_without_overwrite_fails(broker: BrokerHarness, exports: Path) -> None:
    """Other content for an existing path fails, suggests a new path, keeps the file."""
    write(broker, "a.txt", "old\n")
    result = write(broker, "a.txt", "new\n")
    assert result["status"] == "failed"
    assert "new path" in result["reason"]
    assert "overwrite" in result["reason"]
    assert (exports / "a.txt").read_text() == "old\n"


def test_overwrite_waits_for_a_person_with_a_diff(broker: BrokerHarness, exports: Path) -> None:
    """overwrite: true cannot be undone, so it waits, showing the reviewer a diff."""
    write(broker, "notes/a.txt", "line one\nline two\n")
    doc = broker.request(
        "files.write", {"path": "notes/a.txt", "content": "line one\nline 2\n", "overwrite": True}
    )
    result = checked(broker.submit(doc, terminal=False))
    assert result["status"] == "pending"
    assert result["on_timeout"] == "deny"
    assert result["expires_at"]
    assert (exports / "notes" / "a.txt").read_text() == "line one\nline two\n"

    ledger = Ledger(broker.config.ledger_path)
    try:
        record = ledger.get(broker.sandbox, doc["id"])
    finally:
        ledger.close()
    assert record is not None and record.preview is not None
    assert record.preview["body_kind"] == "diff"
    assert "-line two\n" in record.preview["body"]
    assert "+line 2\n" in record.preview["body"]


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("../escape.txt", id="dotdot"),
        pytest.param("a/../../escape.txt", id="nested-dotdot"),
        pytest.param("/tmp/escape.txt", id="absolute"),
        pytest.param("a\x01b.txt", id="control-char"),
        pytest.param("line\nbreak.txt", id="newline"),
        pytest.param(".", id="the-root-itself"),
    ],
)
def test_paths_leaving_the_root_are_invalid(
    broker: BrokerHarness, exports: Path, tmp_path: Path, path: str
) -> None:
    """A path that is absolute, climbs out or holds control characters is `invalid`."""
    result = write(broker, path, "x")
    assert result["status"] == "invalid"
    assert [e["path"] for e in result["errors"]] == ["/params/path"]
    assert list(exports.iterdir()) == []
    assert not (tmp_path / "escape.txt").exists()


@pytest.mark.parametrize(
    ("link", "target", "path"),
    [
        pytest.param("link", "", "link/x.txt", id="directory-link"),
        pytest.param("link", "target.txt", "link", id="file-link"),
        pytest.param("link", "missing.txt", "link", id="dangling-link"),
    ],
)
def test_symlinks_in_the_root_are_not_followed(
    broker: BrokerHarness, exports: Path, elsewhere: Path, link: str, target: str, path: str
) -> None:
    """A symbolic link inside the root makes the write fail; nothing lands outside."""
    (elsewhere / "target.txt").write_text("outside\n")
    os.symlink(elsewhere / target if target else elsewhere, exports / link)
    result = write(broker, path, "planted\n")
    assert result["status"] == "failed"
    assert "symbolic link" in result["reason"]
    assert sorted(p.name for p in elsewhere.iterdir()) == ["target.txt"]
    assert (elsewhere / "target.txt").read_text() == "outside\n"
    assert (exports / link).is_symlink()


def test_unconfigured_root_fails_naming_the_setting(tmp_path: Path) -> None:
    """Without [integrations.files] root, files.write fails and says what to configure."""
    with running(BrokerHarness(tmp_path / "b")) as h:
        result = write(h, "a.txt", "x")
        assert result["status"] == "failed"
        assert "[integrations.files]" in result["reason"]


def test_concurrent_writes_to_one_path_never_clobber(broker: BrokerHarness, exports: Path) -> None:
    """Two requests for one new path at once: one is applied, the other fails with a
    reason the agent can act on, and the file holds the applied one's content."""
    pairs = [
        [broker.request("files.write", {"path": f"f{i}.txt", "content": c * 64}) for c in "AB"]
        for i in range(20)
    ]
    for pair in pairs:
        for doc in pair:
            broker.write(f"{doc['id']}.json", doc)
    wrong = []
    for i, pair in enumerate(pairs):
        results = [checked(broker.wait(doc["id"])) for doc in pair]
        applied = [
            d["params"]["content"]
            for d, r in zip(pair, results, strict=True)
            if r["status"] == "applied"
        ]
        reasons = [r["reason"] for r in results if r["status"] != "applied"]
        content = (exports / f"f{i}.txt").read_text()
        if len(applied) != 1 or applied[0] != content or not all("new path" in r for r in reasons):
            wrong.append(f"f{i}.txt: applied {len(applied)}, others: {reasons}")
    assert wrong == []
    assert [p.name for p in exports.iterdir() if p.name.startswith(".")] == []
