"""Finding 12, the smaller items, each reproduced."""

from __future__ import annotations

import os
import socket
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from broker.clock import iso
from broker.config import Config
from broker.loop.deadlines import Deadlines
from broker.models import Record
from broker.registry import Registry
from broker.testing import BrokerHarness, FakeClock, make_context
from broker.untrusted import neutralize
from broker.web.server import start_web
from effects.files import FilesWrite
from tests.support import checked


def test_the_diff_marks_a_missing_final_newline(tmp_path: Path) -> None:
    """Old file without a final newline: the removed and added lines stay two lines,
    with git's `\\ No newline at end of file` between them."""
    (tmp_path / "sandbox-1").mkdir()
    (tmp_path / "sandbox-1" / "a.txt").write_text("one\ntwo")
    ctx = make_context({"root": str(tmp_path)}, integration="files")
    preview = FilesWrite().preview(
        {"path": "a.txt", "content": "one\nthree\n", "overwrite": True}, ctx
    )
    assert preview.body_kind == "diff"
    lines = preview.body.splitlines()
    assert lines[-3:] == ["-two", "\\ No newline at end of file", "+three"]


@pytest.mark.parametrize(
    "char",
    ["\u3164", "\u2800", "\ufe0f", "\u034f", "\u115f", "\U000e0041", "\u00a0"],
)
def test_blank_and_ignorable_characters_are_shown(char: str) -> None:
    """Hangul fillers, the Braille blank, variation selectors, the grapheme joiner, tag
    characters and non-ASCII spaces are shown as tags, never passed through."""
    shown = neutralize(f"rm -rf /tmp/x{char}/")
    assert char not in shown
    assert f"{ord(char):02X}" in shown.upper()


def pending(expires: datetime) -> Record:
    return Record(
        sandbox="s", id="r", name="r", state="pending", received_at="", expires_at=iso(expires)
    )


def test_deadlines_do_not_follow_a_wall_clock_step() -> None:
    """An hour's deadline: a wall-clock step of two hours forward moves nothing; the
    request is due when an hour has passed on the monotonic clock, not before."""
    clock = FakeClock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    deadlines = Deadlines(clock)
    deadlines.watch(pending(clock.now() + timedelta(hours=1)))
    clock.step_wall(timedelta(hours=2))
    assert deadlines.due() == []
    assert deadlines.seconds_left() == pytest.approx(3600.0)
    clock.step_wall(-timedelta(days=1))  # a step back does not make it wait longer
    clock.advance(3600.0)
    assert deadlines.due() == [("s", "r")]


def test_localhost_is_bound_as_127_0_0_1_without_a_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--listen localhost:0` binds 127.0.0.1 and never asks the resolver (which could
    answer with a public address); each lookup is recorded, none is for localhost."""
    asked: list[Any] = []
    real = socket.getaddrinfo

    def recording(host: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", recording)
    server = start_web(Config(state_dir=tmp_path / "state"), Registry(), "localhost:0")
    assert server is not None
    try:
        assert server.host == "127.0.0.1"
        assert not any(str(h).lower() == "localhost" for h in asked)
    finally:
        server.stop()


def test_sandboxes_sharing_a_files_root_learn_nothing_of_each_other(tmp_path: Path) -> None:
    """Sandbox `a` writes notes.txt; `b` writing the same name (same or other content) is
    told nothing of it: a new file of its own, and `a`'s file is untouched."""
    root = tmp_path / "exports"
    root.mkdir()
    files = {"files": {"root": str(root)}}
    with BrokerHarness(tmp_path / "a", integrations=files, sandbox="a") as a:
        first = checked(a.submit(a.request("files.write", {"path": "notes.txt", "content": "S"})))
    with BrokerHarness(tmp_path / "b", integrations=files, sandbox="b") as b:
        same = checked(b.submit(b.request("files.write", {"path": "notes.txt", "content": "S"})))
        other = checked(
            b.submit(b.request("files.write", {"path": "x/../notes2.txt", "content": "T"}))
        )
        again = checked(b.submit(b.request("files.write", {"path": "notes.txt", "content": "S"})))
    assert first["output"]["created"] is True
    assert same["status"] == "applied" and same["output"]["created"] is True
    assert other["status"] == "invalid"
    assert again["output"] == {**same["output"], "created": False, "changed": False}
    assert (root / "a" / "notes.txt").read_text() == "S"
    assert (root / "b" / "notes.txt").read_text() == "S"


def test_a_directory_made_by_another_request_meanwhile_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race: another request makes `new/` between this one's failed open and its
    mkdir (the mkdir is made to land second, as it would). The write still succeeds."""
    ctx = make_context({"root": str(tmp_path), "per_sandbox": False}, integration="files")
    real_mkdir = os.mkdir

    def second(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(path, mode, dir_fd=dir_fd)  # the other request's mkdir, first
        real_mkdir(path, mode, dir_fd=dir_fd)  # then ours: FileExistsError

    monkeypatch.setattr(os, "mkdir", second)
    out = FilesWrite().apply({"path": "new/deeper/a.txt", "content": "x"}, ctx)
    assert out["created"] is True
    assert (tmp_path / "new" / "deeper" / "a.txt").read_text() == "x"


def test_concurrent_writes_into_one_new_directory_all_apply(tmp_path: Path) -> None:
    """Sixteen requests at once, each a new file in the same new directories: all applied."""
    ctx = make_context({"root": str(tmp_path), "per_sandbox": False}, integration="files")
    start = threading.Barrier(16)
    errors: list[BaseException] = []

    def write(i: int) -> None:
        start.wait()
        try:
            FilesWrite().apply({"path": f"shared/dir/f{i}.txt", "content": str(i)}, ctx)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(list((tmp_path / "shared" / "dir").iterdir())) == 16
