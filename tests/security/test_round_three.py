"""Issue 24: a reused id answered on its own (finding 8), and the smaller findings of
round three (finding 10), each reproduced first."""

from __future__ import annotations

import json
from pathlib import Path

from broker.testing import BrokerHarness, FakeHandler
from tests.support import barrier, eventually


def test_a_file_named_after_a_taken_id_gets_its_own_refusal(tmp_path: Path) -> None:
    """Finding 8: `n1.json` says `"id": "n2"` and is applied; then `n2.json` arrives.
    Its agent reads results/n2.json: an `invalid` (duplicate_id) result with its own
    request's sha256, never n1's `applied` one; nothing more is applied."""
    fake = FakeHandler()
    with BrokerHarness(tmp_path / "h", handlers=[fake]) as h:
        first = {**h.request("test.record", {"value": "first"}), "id": "n2"}
        h.write("n1.json", first)
        assert h.wait("n2")["status"] == "applied"
        second = {k: v for k, v in h.request("test.record", {"value": "second"}).items()}
        second.pop("id")
        h.write("n2.json", second)
        barrier(h)
        path = h.results / "n2.json"
        eventually(lambda: json.loads(path.read_text())["status"] == "invalid")
        own = json.loads(path.read_text())
        assert [e["code"] for e in own["errors"]] == ["duplicate_id"]
        assert "n1.json" in own["reason"]
        applied = h.broker.ledger.get(h.sandbox, "n2") if h.broker else None
        assert applied is not None and applied.state == "applied"  # the ledger keeps n1's
        assert own["request_sha256"] != applied.sha256
        assert fake.applied == [{"value": "first"}]


def test_a_files_write_preview_creates_nothing(tmp_path: Path) -> None:
    """Finding 10: previewing (staged mode previews every request) made root/<sandbox>/
    on the host; a preview changes nothing, and still reads an existing file."""
    from broker.testing import make_context
    from effects.files import FilesWrite

    root = tmp_path / "exports"
    root.mkdir()
    ctx = make_context({"root": str(root)}, integration="files", sandbox="sb1")
    preview = FilesWrite().preview({"path": "a/report.txt", "content": "x"}, ctx)
    assert ("exists", "no: a new file") in preview.facts
    assert list(root.iterdir()) == []
    FilesWrite().apply({"path": "a/report.txt", "content": "x"}, ctx)
    again = FilesWrite().preview({"path": "a/report.txt", "content": "y"}, ctx)
    assert ("exists", "yes, 1 bytes") in again.facts


def test_a_symlinked_sandbox_dir_is_refused(tmp_path: Path) -> None:
    """Finding 10: `<state>/sandboxes/<id>` a link to a foreign dir holding outbox/: the
    broker served it and made results/ and claimed/ there. Now it is refused, with a
    line naming the link, and nothing is made in the foreign dir."""
    import pytest

    from broker.errors import ConfigError
    from broker.intake.outbox import Served

    root, foreign = tmp_path / "sandboxes", tmp_path / "foreign"
    (foreign / "outbox").mkdir(parents=True)
    (root / "real" / "outbox").mkdir(parents=True)
    (root / "evil").symlink_to(foreign)
    served = Served(tmp_path / "control", lambda box: True)
    served.add_root(root)
    try:
        assert [b.sandbox for b in served.discover()] == ["real"]
    finally:
        served.close()
    assert sorted(p.name for p in foreign.iterdir()) == ["outbox"]
    from broker.intake.outbox import from_layout

    with pytest.raises(ConfigError, match="symbolic link"):
        from_layout(root, "evil")


def _at_once(cache_dir: Path, remote: object, n: int = 8) -> tuple[list[Path], list[Exception]]:
    """`n` threads asking for the remote's cache at the same moment."""
    import threading

    from broker.testing import make_context
    from effects.git import GitPush

    ctx = make_context({"cache_dir": str(cache_dir)}, integration="git")
    start = threading.Barrier(n)
    got: list[Path] = []
    errors: list[Exception] = []

    def first() -> None:
        start.wait()
        try:
            got.append(GitPush()._cache(remote, ctx))  # type: ignore[arg-type]
        except Exception as exc:  # what the race raised
            errors.append(exc)

    threads = [threading.Thread(target=first) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got, errors


def test_first_pushes_at_once_share_one_fresh_cache(tmp_path: Path) -> None:
    """Finding 10: two git.push applied at once on a fresh cache raced in `git init`
    ("cannot copy '…/hooks/pre-rebase.sample': File exists") and one failed. Eight at
    once, four times over: every one gets the same usable cache."""
    import subprocess

    from effects.gitrun import Remote

    remote = Remote("origin", str(tmp_path / "r.git"), None, "x", "main")
    for round_ in range(4):
        got, errors = _at_once(tmp_path / f"cache{round_}", remote)
        assert errors == [] and len(set(got)) == 1
        done = subprocess.run(
            ["git", "--git-dir", str(got[0]), "rev-parse", "--is-bare-repository"],
            capture_output=True,
            text=True,
        )
        assert done.stdout.strip() == "true"
        assert [p.name for p in got[0].parent.iterdir()] == ["origin.git"]  # nothing aside
