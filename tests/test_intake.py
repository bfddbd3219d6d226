"""Reading what a sandbox wrote: hostile files get an answer, never a hang or a leak."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from broker.config import Limits
from broker.errors import Rejected
from broker.intake import claims as intake
from broker.intake.claims import Kind
from broker.models import canonical_json, sha256_hex
from broker.testing import BrokerHarness, FakeHandler
from tests.support import eventually

ROOT = Path(__file__).resolve().parent.parent
RESULT_SCHEMA = Draft202012Validator(json.loads((ROOT / "schemas" / "result.json").read_text()))
SMALL_LIMIT = 512


# -- helpers --------------------------------------------------------------------


def check_results(results_dir: Path) -> None:
    """Every result file in `results_dir` matches schemas/result.json."""
    for path in results_dir.iterdir():
        if path.name.startswith("."):
            continue
        errors = [e.message for e in RESULT_SCHEMA.iter_errors(json.loads(path.read_bytes()))]
        assert not errors, f"{path.name}: {errors}"


def answer(h: BrokerHarness, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
    """The terminal result for `request_id`, after checking every result file's schema."""
    result = h.wait(request_id, timeout=timeout)
    check_results(h.results)
    return result


def codes(result: dict[str, Any]) -> list[str]:
    return [e["code"] for e in result["errors"]]


def audit_lines(h: BrokerHarness) -> list[dict[str, Any]]:
    """The audit log's complete lines, parsed (a line being appended is skipped)."""
    path = h.config.audit_path
    if not path.exists():
        return []
    events = []
    for line in path.read_bytes().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def wait_audit(h: BrokerHarness, request_id: str, event: str) -> dict[str, Any]:
    """The first audit event `event` for `request_id`, waiting for the log to catch up."""
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        found[:] = [
            e for e in audit_lines(h) if e.get("id") == request_id and e.get("event") == event
        ]
        return bool(found)

    eventually(seen)
    return found[0]


def still_serving(h: BrokerHarness) -> dict[str, Any]:
    """Submit an ordinary request and check it is applied: the broker survived."""
    doc = h.request("test.record", {"value": f"alive-{uuid.uuid4().hex[:8]}"})
    h.write(f"{doc['id']}.json", doc)
    result = answer(h, doc["id"])
    assert result["status"] == "applied", result
    return result


def logged(caplog: pytest.LogCaptureFixture, *parts: str, timeout: float = 5.0) -> bool:
    """Whether a log record holding every one of `parts` appears within `timeout`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(all(p in r.getMessage() for p in parts) for r in caplog.records):
            return True
        time.sleep(0.01)
    return False


def request_bytes(request_id: str, value: str = "x") -> bytes:
    doc = {"version": 1, "id": request_id, "effect": "test.record", "params": {"value": value}}
    return json.dumps(doc).encode()


def plant(h: BrokerHarness, name: str, make: Callable[[Path], None]) -> Path:
    """Create an outbox entry with `make(tmp)` under a temporary name, then rename it in."""
    tmp = h.outbox / f".{uuid.uuid4().hex}.tmp"
    make(tmp)
    os.rename(tmp, h.outbox / name)
    return h.outbox / name


def result_names(h: BrokerHarness) -> set[str]:
    return {n for n in os.listdir(h.results) if not n.startswith(".")}


# -- fixtures -------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_fake() -> FakeHandler:
    """The test.record handler of `shared_harness`."""
    return FakeHandler("test.record")


@pytest.fixture(scope="module")
def shared_harness(
    tmp_path_factory: pytest.TempPathFactory, shared_fake: FakeHandler
) -> Iterator[BrokerHarness]:
    """One running broker with default limits for this module, warm (it has answered)."""
    with BrokerHarness(
        tmp_path_factory.mktemp("intake"), handlers=[shared_fake], builtins=False
    ) as h:
        still_serving(h)
        yield h


@pytest.fixture(scope="module")
def small_limit_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerHarness]:
    """A running broker whose request size limit is SMALL_LIMIT bytes."""
    with BrokerHarness(
        tmp_path_factory.mktemp("small"),
        handlers=[FakeHandler("test.record")],
        limits=Limits(max_request_bytes=SMALL_LIMIT),
        builtins=False,
    ) as h:
        still_serving(h)
        yield h


@pytest.fixture
def outbox_fd(tmp_path: Path) -> Iterator[int]:
    """A directory fd on an empty temp dir, for calling intake.read_file directly."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


# -- special files through the running broker -----------------------------------


def test_symlink_request_is_invalid_and_never_followed(
    shared_harness: BrokerHarness, shared_fake: FakeHandler, tmp_path: Path
) -> None:
    """A symlink to a host file is `not_regular_file`; the target is neither read nor touched."""
    marker = f"HOST-SECRET-{uuid.uuid4().hex}"
    target = tmp_path / "host-secret.json"
    target.write_bytes(request_bytes("link", marker))
    before = target.stat()
    link = shared_harness.outbox / "link.json"
    os.symlink(target, link)

    result = answer(shared_harness, "link")

    assert result["status"] == "invalid"
    assert codes(result) == ["not_regular_file"]
    assert "symbolic link" in result["reason"]
    assert not os.path.lexists(link)
    assert target.read_bytes() == request_bytes("link", marker)
    assert (target.stat().st_mtime_ns, target.stat().st_size) == (
        before.st_mtime_ns,
        before.st_size,
    )
    wait_audit(shared_harness, "link", "invalid")
    assert marker.encode() not in shared_harness.config.audit_path.read_bytes()
    for path in shared_harness.results.iterdir():
        assert marker.encode() not in path.read_bytes()
    assert all(a.get("value") != marker for a in shared_fake.applied)


def test_fifo_request_is_answered_without_hanging(shared_harness: BrokerHarness) -> None:
    """A FIFO named like a request gets `invalid` within seconds and is removed."""
    started = time.monotonic()
    plant(shared_harness, "fifo.json", os.mkfifo)

    result = answer(shared_harness, "fifo", timeout=3.0)

    assert time.monotonic() - started < 3.0
    assert result["status"] == "invalid"
    assert codes(result) == ["not_regular_file"]
    assert "FIFO" in result["reason"]
    assert not os.path.lexists(shared_harness.outbox / "fifo.json")
    still_serving(shared_harness)


def test_unix_socket_request_is_invalid(
    shared_harness: BrokerHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Unix socket named like a request is `not_regular_file` and removed."""
    monkeypatch.chdir(shared_harness.outbox)  # a relative path keeps under the sun_path limit
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind("sock.json")

    result = answer(shared_harness, "sock")

    assert result["status"] == "invalid"
    assert codes(result) == ["not_regular_file"]
    assert "socket" in result["reason"]
    assert not os.path.lexists(shared_harness.outbox / "sock.json")


def test_directory_named_like_a_request_is_invalid(shared_harness: BrokerHarness) -> None:
    """A directory `folder.json` (with files in it) is `not_regular_file` and removed."""

    def make(path: Path) -> None:
        path.mkdir()
        (path / "inner.json").write_bytes(request_bytes("inner"))

    plant(shared_harness, "folder.json", make)

    result = answer(shared_harness, "folder")

    assert result["status"] == "invalid"
    assert codes(result) == ["not_regular_file"]
    assert "directory" in result["reason"]
    assert not os.path.lexists(shared_harness.outbox / "folder.json")
    assert not (shared_harness.results / "inner.json").exists()


def test_device_node_request_is_invalid(shared_harness: BrokerHarness) -> None:
    """A character device (like /dev/zero) named like a request is `not_regular_file`."""
    try:
        plant(
            shared_harness,
            "device.json",
            lambda p: os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 5)),
        )
    except PermissionError:
        pytest.skip("cannot create device nodes here")

    result = answer(shared_harness, "device")

    assert result["status"] == "invalid"
    assert codes(result) == ["not_regular_file"]
    assert not os.path.lexists(shared_harness.outbox / "device.json")


def test_hard_link_request_is_invalid(
    shared_harness: BrokerHarness, shared_fake: FakeHandler, tmp_path: Path
) -> None:
    """A second link to a file elsewhere is `hard_link`; the other file is left intact."""
    marker = f"hardlinked-{uuid.uuid4().hex}"
    other = tmp_path / "other.json"
    other.write_bytes(request_bytes("hardlink", marker))
    os.link(other, shared_harness.outbox / "hardlink.json")

    result = answer(shared_harness, "hardlink")

    assert result["status"] == "invalid"
    assert codes(result) == ["hard_link"]
    assert not os.path.lexists(shared_harness.outbox / "hardlink.json")
    assert other.read_bytes() == request_bytes("hardlink", marker)
    eventually(lambda: other.stat().st_nlink == 1)
    assert all(a.get("value") != marker for a in shared_fake.applied)


# -- size -----------------------------------------------------------------------


def padded(request_id: str, size: int) -> bytes:
    """A valid request padded with trailing whitespace to exactly `size` bytes."""
    data = request_bytes(request_id)
    assert len(data) <= size
    return data + b" " * (size - len(data))


def test_request_of_exactly_the_size_limit_is_applied(
    small_limit_harness: BrokerHarness,
) -> None:
    """A request of exactly max_request_bytes is accepted and applied."""
    small_limit_harness.write("at-limit.json", padded("at-limit", SMALL_LIMIT))

    assert answer(small_limit_harness, "at-limit")["status"] == "applied"


def test_request_one_byte_over_the_limit_is_too_large(
    small_limit_harness: BrokerHarness,
) -> None:
    """A request of max_request_bytes + 1 is `too_large` and names the limit."""
    small_limit_harness.write("over-limit.json", padded("over-limit", SMALL_LIMIT + 1))

    result = answer(small_limit_harness, "over-limit")

    assert result["status"] == "invalid"
    assert codes(result) == ["too_large"]
    assert str(SMALL_LIMIT) in result["reason"]
    assert not (small_limit_harness.outbox / "over-limit.json").exists()


def test_sparse_huge_file_is_too_large_and_answered_fast(shared_harness: BrokerHarness) -> None:
    """A 100 GiB sparse file is `too_large` within seconds: its size is checked, not read."""

    def make(path: Path) -> None:
        with path.open("wb") as f:
            f.truncate(100 * 2**30)

    started = time.monotonic()
    plant(shared_harness, "sparse.json", make)

    result = answer(shared_harness, "sparse", timeout=3.0)

    assert time.monotonic() - started < 3.0
    assert result["status"] == "invalid"
    assert codes(result) == ["too_large"]
    assert not os.path.lexists(shared_harness.outbox / "sparse.json")


# -- malformed content through the running broker -------------------------------


def envelope_around(params_json: str, request_id: str) -> bytes:
    return (
        f'{{"version": 1, "id": "{request_id}", "effect": "test.record", '
        f'"params": {{"value": {params_json}}}}}'
    ).encode()


MALFORMED: dict[str, tuple[bytes, str]] = {
    "deeper-than-limit": (envelope_around("[" * 70 + "]" * 70, "x"), "too_deep"),
    "deep-100k-arrays": (b"[" * 100_000 + b"]" * 100_000, "too_deep"),
    "deep-100k-objects": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "too_deep"),
    "duplicate-effect-key": (
        b'{"version": 1, "effect": "test.record", "effect": "files.write", "params": {}}',
        "duplicate_key",
    ),
    "duplicate-nested-key": (
        b'{"version": 1, "effect": "test.record", "params": {"value": "a", "value": "b"}}',
        "duplicate_key",
    ),
    "nan": (envelope_around("NaN", "x"), "non_finite_number"),
    "infinity": (envelope_around("Infinity", "x"), "non_finite_number"),
    "minus-infinity": (envelope_around("-Infinity", "x"), "non_finite_number"),
    "overflowing-float": (envelope_around("1e999", "x"), "non_finite_number"),
    "huge-integer": (envelope_around("9" * 5000, "x"), "bad_number"),
    "bad-utf8": (envelope_around('"caf"', "x").replace(b"caf", b"caf\xe9"), "bad_utf8"),
    "lone-surrogate": (envelope_around('"\\ud800"', "x"), "bad_unicode"),
    "byte-order-mark": (b"\xef\xbb\xbf" + request_bytes("x"), "bad_json"),
    "not-json": (b'{"version": 1, "effect": ', "bad_json"),
    "top-level-array": (b'[{"version": 1, "effect": "test.record", "params": {}}]', "type"),
    "empty-file": (b"", "bad_json"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_request_is_invalid_with_its_code(
    shared_harness: BrokerHarness, shared_fake: FakeHandler, name: str
) -> None:
    """Each malformed file is answered `invalid` under its file name, with the right code."""
    data, code = MALFORMED[name]
    data = data.replace(b'"id": "x"', f'"id": "{name}"'.encode())
    applied_before = len(shared_fake.applied)
    shared_harness.write(f"{name}.json", data)

    result = answer(shared_harness, name)

    assert result["status"] == "invalid"
    assert codes(result) == [code]
    assert result["reason"].startswith("invalid: ")
    assert len(shared_fake.applied) == applied_before
    assert not (shared_harness.outbox / f"{name}.json").exists()


def test_malformed_file_result_hashes_the_bytes_received(shared_harness: BrokerHarness) -> None:
    """An unparsable request's result carries the sha256 of the exact bytes received."""
    data = b'{"version": 1, "effect": "test.record", "params": {"value": NaN}}'
    shared_harness.write("hash-of-bytes.json", data)

    result = answer(shared_harness, "hash-of-bytes")

    assert result["request_sha256"] == sha256_hex(data)


def test_very_deep_request_leaves_the_broker_serving(shared_harness: BrokerHarness) -> None:
    """After 100k levels of nesting the broker still applies ordinary requests."""
    shared_harness.write("deep-again.json", b"[" * 100_000 + b"]" * 100_000)

    assert answer(shared_harness, "deep-again")["status"] == "invalid"
    still_serving(shared_harness)


# -- names ----------------------------------------------------------------------

BAD_NAMES: dict[str, bytes] = {
    "leading dash": b"-x.json",
    "space": b"a b.json",
    "newline": b"x\n.json",
    "129 chars": b"a" * 129 + b".json",
    "upper-case suffix": b"x.JSON",
    "non-utf8 bytes": b"\xff\xfe.json",
    "leading underscore": b"_x.json",
    "trailing tilde": b"x.json~",
}
TEMPORARY_NAMES: dict[str, bytes] = {
    "leading dot": b".x.json",
    "tmp suffix": b"x.json.tmp",
}


def plant_named(h: BrokerHarness, name: bytes, data: bytes) -> bytes:
    """Write `data` under the raw byte name `name` in the outbox (atomically)."""
    tmp = h.outbox / f".{uuid.uuid4().hex}.tmp"
    tmp.write_bytes(data)
    path = os.path.join(os.fsencode(h.outbox), name)
    os.rename(os.fsencode(tmp), path)
    return path


@pytest.mark.parametrize("label", list(BAD_NAMES))
def test_bad_name_is_ignored_and_left_in_place(
    shared_harness: BrokerHarness,
    shared_fake: FakeHandler,
    caplog: pytest.LogCaptureFixture,
    label: str,
) -> None:
    """A file whose name breaks the rule gets no result, stays, and is logged for operators."""
    caplog.set_level(logging.WARNING, logger="broker")
    marker = f"bad-name-{uuid.uuid4().hex}"
    results_before = result_names(shared_harness)
    path = plant_named(shared_harness, BAD_NAMES[label], request_bytes("bad-name", marker))
    try:
        alive = still_serving(shared_harness)

        assert os.path.lexists(path)
        assert result_names(shared_harness) - results_before == {f"{alive['id']}.json"}
        assert all(a.get("value") != marker for a in shared_fake.applied)
        assert logged(caplog, "not a request name", repr(os.fsdecode(BAD_NAMES[label])))
    finally:
        os.unlink(path)


def test_longest_request_name_without_id_is_answered_under_its_name(
    shared_harness: BrokerHarness,
) -> None:
    """A 128-character name (the protocol's longest) with no id gets its result by that name."""
    name = "n" * 128
    shared_harness.write(f"{name}.json", {"version": 1, "effect": "test.record", "params": {}})

    result = answer(shared_harness, name)

    assert (result["id"], result["status"]) == (name, "applied")


@pytest.mark.parametrize("label", list(TEMPORARY_NAMES))
def test_temporary_name_is_ignored_and_left_in_place(
    shared_harness: BrokerHarness, shared_fake: FakeHandler, label: str
) -> None:
    """A temporary file (`.x.json`, `x.json.tmp`) is neither answered nor removed."""
    marker = f"temporary-{uuid.uuid4().hex}"
    results_before = result_names(shared_harness)
    path = plant_named(shared_harness, TEMPORARY_NAMES[label], request_bytes("tmp-name", marker))
    try:
        alive = still_serving(shared_harness)

        assert os.path.lexists(path)
        assert result_names(shared_harness) - results_before == {f"{alive['id']}.json"}
        assert all(a.get("value") != marker for a in shared_fake.applied)
    finally:
        os.unlink(path)


def after_a_rescan(h: BrokerHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Return just after one of the broker's periodic rescans: the next is an interval away."""
    assert h.broker is not None
    done = threading.Event()
    rescan = h.broker.rescan

    def observed() -> None:
        rescan()
        done.set()

    monkeypatch.setattr(h.broker, "rescan", observed)
    assert done.wait(h.config.rescan_interval_s + 3)


def test_request_right_after_a_non_utf8_name_is_noticed_at_once(
    shared_harness: BrokerHarness,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A non-UTF-8 file name does not blind the broker to requests written just after it."""
    caplog.set_level(logging.WARNING, logger="broker")
    after_a_rescan(shared_harness, monkeypatch)
    bad = plant_named(shared_harness, b"\xfa\xfb.json", b"{}")
    try:
        assert logged(caplog, "not a request name", repr(os.fsdecode(b"\xfa\xfb.json")))
        started = time.monotonic()
        doc = shared_harness.request("test.record", {"value": "after-bad-bytes"})
        shared_harness.write(f"{doc['id']}.json", doc)
        result = answer(shared_harness, doc["id"])
        elapsed = time.monotonic() - started
    finally:
        os.unlink(bad)
    assert result["status"] == "applied"
    assert elapsed < 1.0, f"answered only after {elapsed:.1f}s, at the next periodic rescan"


def test_request_name_that_editors_use_is_noticed_at_once(
    shared_harness: BrokerHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A valid request name like `flycheck_x.json` is answered at once, not at a rescan."""
    after_a_rescan(shared_harness, monkeypatch)
    started = time.monotonic()
    doc = shared_harness.request("test.record", {"value": "flycheck"})
    shared_harness.write("flycheck_x.json", doc)
    result = answer(shared_harness, doc["id"])
    elapsed = time.monotonic() - started
    assert result["status"] == "applied"
    assert elapsed < 1.0, f"answered only after {elapsed:.1f}s, at the next periodic rescan"


# -- everything at once, and edits after the read --------------------------------


def test_broker_survives_every_hostile_file_at_once(
    harness: BrokerHarness, fake: FakeHandler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every kind of hostile entry planted together, each is answered and work goes on."""
    secret = tmp_path / "secret.json"
    secret.write_bytes(request_bytes("h-link", "secret"))
    os.symlink(secret, harness.outbox / "h-link.json")
    os.mkfifo(harness.outbox / "h-fifo.json")
    monkeypatch.chdir(harness.outbox)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind("h-sock.json")
    (harness.outbox / "h-dir.json").mkdir()
    other = tmp_path / "other.json"
    other.write_bytes(request_bytes("h-hard"))
    os.link(other, harness.outbox / "h-hard.json")
    with (harness.outbox / "h-sparse.json").open("wb") as f:
        f.truncate(100 * 2**30)
    for name, (data, _) in MALFORMED.items():
        harness.write(f"h-{name}.json", data.replace(b'"id": "x"', f'"id": "h-{name}"'.encode()))
    for name in [*BAD_NAMES.values(), *TEMPORARY_NAMES.values()]:
        plant_named(harness, name, request_bytes("h-bad", "bad"))

    expected = {
        "h-link": "not_regular_file",
        "h-fifo": "not_regular_file",
        "h-sock": "not_regular_file",
        "h-dir": "not_regular_file",
        "h-hard": "hard_link",
        "h-sparse": "too_large",
        **{f"h-{name}": code for name, (_, code) in MALFORMED.items()},
    }
    for request_id, code in expected.items():
        result = answer(harness, request_id)
        assert (result["status"], codes(result)) == ("invalid", [code]), request_id

    still_serving(harness)
    assert [a["value"] for a in fake.applied if a["value"] in ("secret", "bad", "x")] == []
    assert secret.read_bytes() == request_bytes("h-link", "secret")


def test_request_rewritten_after_it_was_read_is_applied_as_first_read(
    harness: BrokerHarness, fake: FakeHandler
) -> None:
    """A new file with the same name and id, sent during apply, changes nothing but is audited."""
    doc = harness.request("test.record", {"value": "original"})
    rewritten = dict(doc, params={"value": "rewritten"})
    fake.release.clear()
    try:
        harness.write("rewrite.json", doc)
        assert fake.started.wait(5)
        harness.write("rewrite.json", rewritten)
        eventually(lambda: not (harness.outbox / "rewrite.json").exists())
    finally:
        fake.release.set()

    result = answer(harness, doc["id"])
    rewritten_sha = sha256_hex(canonical_json(rewritten))
    eventually(lambda: any(e.get("sha256") == rewritten_sha for e in audit_lines(harness)))

    assert result["status"] == "applied"
    assert fake.applied == [{"value": "original"}]
    assert result["output"]["value"] == "original"
    assert result["request_sha256"] == sha256_hex(canonical_json(doc))
    assert not (harness.outbox / "rewrite.json").exists()


def test_request_renamed_in_while_still_open_is_read_after_its_writer_closes(
    harness: BrokerHarness, fake: FakeHandler
) -> None:
    """A request renamed into place while its writer still holds it open for writing is
    not read half-way: the broker waits for the close and applies what was complete."""
    doc = harness.request("test.record", {"value": "original"})
    tmp = harness.outbox / ".in-place.json.tmp"
    with tmp.open("wb") as f:
        f.write(json.dumps(doc).encode()[:20])
        f.flush()
        os.rename(tmp, harness.outbox / "in-place.json")
        assert not fake.started.wait(0.5)  # still open for writing: not read
        f.seek(0)
        f.truncate()
        edited = dict(doc, params={"value": "edited"})
        f.write(json.dumps(edited).encode())
        f.flush()

    result = answer(harness, doc["id"])

    assert result["status"] == "applied"
    assert fake.applied == [{"value": "edited"}]
    assert result["request_sha256"] == sha256_hex(canonical_json(edited))


# -- unit: classify -------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [
        ("abc.json", (Kind.REQUEST, "abc", "")),
        ("A-1_b.json", (Kind.REQUEST, "A-1_b", "")),
        ("a" * 128 + ".json", (Kind.REQUEST, "a" * 128, "")),
        ("req.fix.bin", (Kind.ATTACHMENT, "req", "fix")),
        (".x.json", (Kind.TEMPORARY, "", "")),
        ("x.json.tmp", (Kind.TEMPORARY, "", "")),
        (".req.fix.bin", (Kind.TEMPORARY, "", "")),
        ("a" * 129 + ".json", (Kind.BAD, "", "")),
        ("-x.json", (Kind.BAD, "", "")),
        ("_x.json", (Kind.BAD, "", "")),
        ("a b.json", (Kind.BAD, "", "")),
        ("x\n.json", (Kind.BAD, "", "")),
        ("x.json\n", (Kind.BAD, "", "")),
        ("x.JSON", (Kind.BAD, "", "")),
        ("x.y.json", (Kind.BAD, "", "")),
        ("\udcff\udcfe.json", (Kind.BAD, "", "")),
        ("é.json", (Kind.BAD, "", "")),
        (".json", (Kind.TEMPORARY, "", "")),
        ("json", (Kind.BAD, "", "")),
        ("req.bin", (Kind.BAD, "", "")),
        ("a.b.c.bin", (Kind.BAD, "", "")),
        ("req." + "f" * 65 + ".bin", (Kind.BAD, "", "")),
    ],
)
def test_classify_sorts_names_by_the_protocol_rule(
    name: str, expected: tuple[Kind, str, str]
) -> None:
    """classify() accepts exactly the protocol's request, attachment and temporary names."""
    assert intake.classify(name) == expected


# -- unit: parse_json -------------------------------------------------------------


def rejected_code(data: bytes, max_depth: int = 64) -> str:
    with pytest.raises(Rejected) as info:
        intake.parse_json(data, max_depth)
    assert info.value.reason.startswith("invalid: ")
    [issue] = info.value.issues
    return issue.code


def test_parse_json_returns_the_document() -> None:
    """Strict JSON that breaks no rule parses to the same value json.loads gives."""
    data = '{"a": [1, 2.5, -3e10, true, null], "b": "caf\u00e9 \\ud83d\\ude00"}'.encode()
    assert intake.parse_json(data, 64) == {"a": [1, 2.5, -3e10, True, None], "b": "café 😀"}


def test_parse_json_accepts_nesting_at_the_limit_and_rejects_one_more() -> None:
    """Exactly max_depth nested containers parse; one more is `too_deep`."""
    assert intake.parse_json(b"[" * 8 + b"]" * 8, 8) is not None
    assert intake.parse_json(b'{"a":' * 8 + b"1" + b"}" * 8, 8) is not None
    assert rejected_code(b"[" * 9 + b"]" * 9, 8) == "too_deep"
    assert rejected_code(b'{"a":' * 9 + b"1" + b"}" * 9, 8) == "too_deep"


def test_parse_json_survives_nesting_beyond_the_recursion_limit() -> None:
    """100k levels give `too_deep`, not a RecursionError."""
    assert rejected_code(b"[" * 100_000 + b"]" * 100_000) == "too_deep"
    assert rejected_code(b'{"a":' * 100_000 + b"1" + b"}" * 100_000) == "too_deep"


@pytest.mark.parametrize(
    "data, code",
    [
        (b'{"a": 1, "a": 1}', "duplicate_key"),
        (b'{"x": {"a": 1, "b": 2, "a": 3}}', "duplicate_key"),
        (b'[{"k": 1, "k": 2}]', "duplicate_key"),
        (b'{"a": NaN}', "non_finite_number"),
        (b'{"a": Infinity}', "non_finite_number"),
        (b'{"a": -Infinity}', "non_finite_number"),
        (b'{"a": 1e999}', "non_finite_number"),
        (b'{"a": -1e999}', "non_finite_number"),
        (b'{"a": ' + b"1" * 5000 + b"}", "bad_number"),
        (b'{"a": -' + b"1" * 5000 + b"}", "bad_number"),
        (b'{"a": "\xff"}', "bad_utf8"),
        (b'{"a": "\xc0\xaf"}', "bad_utf8"),
        (b'{"a": "\xed\xa0\x80"}', "bad_utf8"),
        (b"\xff\xfe{\x00}\x00", "bad_utf8"),
        (b'{"a": "\\ud800"}', "bad_unicode"),
        (b'{"a": "\\udc00x"}', "bad_unicode"),
        (b'{"\\ud800": 1}', "bad_unicode"),
        (b'{"a": ["ok", "\\ude00"]}', "bad_unicode"),
        (b'\xef\xbb\xbf{"a": 1}', "bad_json"),
        (b'{"a": 1,}', "bad_json"),
        (b'{"a": "line\nbreak"}', "bad_json"),
        (b"", "bad_json"),
        (b'{"a": 1} {"b": 2}', "bad_json"),
    ],
)
def test_parse_json_rejects_with_a_code(data: bytes, code: str) -> None:
    """Each departure from strict JSON is Rejected with one issue carrying its code."""
    assert rejected_code(data) == code


def test_parse_json_accepts_a_large_but_finite_number() -> None:
    """A 100-digit integer and 1e308 are fine: only what cannot be represented is refused."""
    assert intake.parse_json(b"[" + b"9" * 100 + b", 1e308]", 64) == [int("9" * 100), 1e308]


# -- unit: read_file -------------------------------------------------------------


def test_read_file_reads_a_regular_file_up_to_the_limit(tmp_path: Path, outbox_fd: int) -> None:
    """A file of exactly `limit` bytes is read whole; one more byte is `too_large`."""
    (tmp_path / "ok.json").write_bytes(b"x" * 100)
    (tmp_path / "big.json").write_bytes(b"x" * 101)

    assert intake.read_file(outbox_fd, "ok.json", 100) == b"x" * 100
    with pytest.raises(Rejected) as info:
        intake.read_file(outbox_fd, "big.json", 100)
    assert [i.code for i in info.value.issues] == ["too_large"]


@pytest.mark.parametrize(
    "make, code",
    [
        (lambda d: os.symlink("/etc/hostname", d / "r.json"), "not_regular_file"),
        (lambda d: os.symlink("missing", d / "r.json"), "not_regular_file"),
        (lambda d: os.mkfifo(d / "r.json"), "not_regular_file"),
        (lambda d: (d / "r.json").mkdir(), "not_regular_file"),
        (
            lambda d: ((d / "a").write_bytes(b"{}"), os.link(d / "a", d / "r.json")),
            "hard_link",
        ),
    ],
    ids=["symlink", "dangling symlink", "fifo", "directory", "hard link"],
)
def test_read_file_refuses_what_is_not_a_lone_regular_file(
    tmp_path: Path, outbox_fd: int, make: Callable[[Path], Any], code: str
) -> None:
    """Links, FIFOs and directories are Rejected before any read (a FIFO never blocks)."""
    make(tmp_path)
    with pytest.raises(Rejected) as info:
        intake.read_file(outbox_fd, "r.json", 1024)
    assert [i.code for i in info.value.issues] == [code]


def test_read_file_reports_a_vanished_file(outbox_fd: int) -> None:
    """A name that is gone raises FileNotFoundError, for the caller to skip quietly."""
    with pytest.raises(FileNotFoundError):
        intake.read_file(outbox_fd, "gone.json", 1024)


def test_bad_names_are_logged_once_each_then_counted(caplog: pytest.LogCaptureFixture) -> None:
    """Each bad name is logged once; past the limit, one line with a count, not one per name
    per rescan."""
    from broker.intake.claims import BadNames

    names = BadNames(limit=3, every_s=3600)
    with caplog.at_level(logging.WARNING, logger="broker"):
        for _ in range(5):  # five rescans of the same directory
            for i in range(10):
                names.note("sb", f"bad name {i}")
    lines = [r.getMessage() for r in caplog.records]
    assert [line for line in lines if "not a request name" in line][:3] == [
        f"sandbox sb: ignoring 'bad name {i}': not a request name" for i in range(3)
    ]
    assert len(lines) == 4, lines
    assert lines[3].startswith("sandbox sb: ignoring 1 more files whose names are not request")


def test_one_noisy_sandbox_does_not_hide_another_s_bad_names(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 24 finding 10: the cap is per sandbox: past one sandbox's limit, another's
    first bad name is still logged by name."""
    from broker.intake.claims import BadNames

    names = BadNames(limit=3, every_s=3600)
    with caplog.at_level(logging.WARNING, logger="broker"):
        for i in range(50):
            names.note("noisy", f"junk {i}")
        names.note("quiet", "hidden?.json")
    lines = [r.getMessage() for r in caplog.records]
    assert "sandbox quiet: ignoring 'hidden?.json': not a request name" in lines
    assert len(lines) == 5, lines
