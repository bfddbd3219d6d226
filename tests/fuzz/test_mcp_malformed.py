"""`outbox mcp` never falls over (issue 24, finding 9): the server in-process on byte
streams, with a catalogue written by hand and no broker (none is needed to refuse bad
input). Deep nesting, oversized lines, batches and random bytes are each answered with a
JSON-RPC error, and the session answers a ping after them."""

from __future__ import annotations

import io
import json
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CLIENT = Path(__file__).resolve().parents[2] / "sandbox_images" / "client"
sys.path.insert(0, str(CLIENT))
import outbox_mcp  # noqa: E402

PING = b'{"jsonrpc": "2.0", "id": "last", "method": "ping"}\n'
EFFECT = {
    "name": "files.write",
    "description": "files.write: write one file below the host's export root",
    "reversible": True,
    "idempotent": True,
    "undo": "a new file can be deleted",
    "params_schema": {"type": "object"},
    "approval": {"summary": "applied at once"},
}


@pytest.fixture(autouse=True)
def sandbox_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "outbox").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / ".effects.json").write_text(
        json.dumps({"version": 1, "effects": [EFFECT]})
    )
    monkeypatch.setenv("OUTBOX_DIR", str(tmp_path / "outbox"))
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path


def session(data: bytes) -> list[dict[str, Any]]:
    """Every message the server wrote for `data` (then EOF); asserts it exited cleanly."""
    out = io.BytesIO()
    assert outbox_mcp.Server(io.BytesIO(data), out).run() == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_deep_nesting_is_refused_not_a_crash() -> None:
    """Before: a line nested ~990 deep raised RecursionError and ended the server."""
    deep = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"a": ' + b"[" * 990
    deep += b"]" * 990 + b"}}\n"
    very = b"[" * 200_000 + b"]" * 200_000 + b"\n"
    replies = session(deep + very + PING)
    assert [r.get("error", {}).get("code") for r in replies] == [-32600, -32600, None]
    assert "nested over 64 deep" in replies[0]["error"]["message"]
    assert replies[-1] == {"jsonrpc": "2.0", "id": "last", "result": {}}


def test_brackets_inside_strings_do_not_count() -> None:
    text = "[" * 500
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"t": text}})
    assert session(line.encode() + b"\n") == [{"jsonrpc": "2.0", "id": 1, "result": {}}]


def test_an_oversized_line_is_refused_and_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox_mcp, "MAX_LINE", 1000)
    big = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"p": "' + b"x" * 5000
    replies = session(big + b'"}}\n' + PING)
    assert [r.get("error", {}).get("code") for r in replies] == [-32600, None]
    assert "over 1000 bytes" in replies[0]["error"]["message"]


def test_a_batch_is_refused_in_every_version_it_agrees_to() -> None:
    """2025-03-26 requires batches, so the server never agrees to it: asked for it, it
    answers with its newest revision; a batch is refused with -32600."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize"}
    asked = {**init, "params": {"protocolVersion": "2025-03-26", "capabilities": {}}}
    batch = json.dumps([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]).encode() + b"\n"
    replies = session(json.dumps(asked).encode() + b"\n" + batch + PING)
    assert replies[0]["result"]["protocolVersion"] == "2025-11-25"
    assert "2025-03-26" not in outbox_mcp.PROTOCOL_VERSIONS
    assert replies[1]["error"] == {
        "code": -32600,
        "message": "Invalid Request: batches are not accepted",
    }
    assert replies[2]["result"] == {}


@pytest.mark.parametrize("version", ["2025-11-25", "2025-06-18", "2024-11-05"])
def test_each_version_it_agrees_to_gets_only_its_own_fields(version: str) -> None:
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize"}
    asked = {**init, "params": {"protocolVersion": version, "capabilities": {}}}
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    replies = session(b"".join(json.dumps(m).encode() + b"\n" for m in (asked, listing)))
    assert replies[0]["result"]["protocolVersion"] == version
    assert replies[0]["result"]["capabilities"]["logging"] == {}
    [tool] = replies[1]["result"]["tools"]
    newer = {"title", "annotations", "outputSchema"}
    if version == "2024-11-05":
        assert not newer & set(tool)
    else:
        assert newer <= set(tool)
        assert tool["annotations"]["title"] == tool["title"]
        assert tool["title"].startswith("files.write — write one file")


def test_a_cancelled_call_not_yet_read_is_withdrawn(sandbox_dirs: Path) -> None:
    """No broker has claimed the request: cancelling the call takes it out of the outbox,
    and a client that asked for log messages is told so."""
    reader, feed = _pipe()
    out = _Lines()
    server = threading.Thread(target=outbox_mcp.Server(reader, out).run)
    server.start()
    feed(
        {"jsonrpc": "2.0", "id": 1, "method": "logging/setLevel", "params": {"level": "info"}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "files.write"}},
    )
    out.until(lambda m: "filed as request" in json.dumps(m))
    [filed] = list((sandbox_dirs / "outbox").glob("*.json"))
    feed({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}})
    said = out.until(lambda m: "cancelled:" in json.dumps(m))
    assert said["params"]["data"].endswith("withdrawn before the broker read it")
    assert not filed.exists()
    feed(None)
    server.join(30)
    reader.close()
    assert not any(m.get("id") == 2 for m in out.messages)  # a cancelled call gets no reply


SEGMENT = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)
EFFECTS = st.lists(SEGMENT, min_size=2, max_size=3).map(".".join)
OPENAI_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


@settings(max_examples=200, deadline=None)
@given(st.lists(EFFECTS | st.just("github.pull_request.create"), min_size=1, max_size=6))
def test_portable_names_are_valid_for_openai_and_map_back(effects: list[str]) -> None:
    """Every portable name passes OpenAI's rule, names one effect, and maps back to it
    (`pull_request` keeps its underscore: a dot becomes a hyphen, never an underscore)."""
    from outbox_mcp_tools import effect_name, portable_name

    names = {portable_name(e) for e in set(effects)}
    assert len(names) == len(set(effects))
    for effect in effects:
        name = portable_name(effect)
        assert OPENAI_NAME.fullmatch(name), name
        assert effect_name(name, effects) == effect
        assert effect_name(effect, effects) == effect  # its own name still works


def test_portable_names_in_a_session() -> None:
    """--portable-names: tools/list names files-write (title and description keep
    files.write) and a tools/call of files-write files a files.write request."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    out = io.BytesIO()
    data = b"".join(json.dumps(m).encode() + b"\n" for m in (init, listing))
    assert outbox_mcp.Server(io.BytesIO(data), out, portable=True).run() == 0
    [tool] = [json.loads(line) for line in out.getvalue().splitlines()][1]["result"]["tools"]
    assert tool["name"] == "files-write"
    assert tool["title"].startswith("files.write — ")
    assert outbox_mcp.effect_name("files-write", ["files.write"]) == "files.write"


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=200) | st.text(max_size=200).map(str.encode), max_size=8))
def test_random_lines_never_end_the_session(lines: list[bytes]) -> None:
    """Whatever the lines, the server returns 0 and still answers the final ping."""
    data = b"".join(line.replace(b"\n", b" ") + b"\n" for line in lines)
    replies = session(data + PING)
    assert replies[-1] == {"jsonrpc": "2.0", "id": "last", "result": {}}
    assert all(r.get("jsonrpc") == "2.0" for r in replies)


def _pipe() -> tuple[Any, Any]:
    import os

    r, w = os.pipe()
    reader = os.fdopen(r, "rb")
    writer = os.fdopen(w, "wb")

    def feed(*messages: dict[str, Any] | None) -> None:
        for message in messages:
            if message is None:
                writer.close()
                return
            writer.write(json.dumps(message).encode() + b"\n")
            writer.flush()

    return reader, feed


class _Lines(io.RawIOBase):
    """The server's output, message by message, for a test to wait on."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        with self._cond:
            self.messages += [json.loads(line) for line in bytes(data).splitlines()]
            self._cond.notify_all()
        return len(data)

    def until(self, ok: Any) -> dict[str, Any]:
        with self._cond:
            assert self._cond.wait_for(lambda: any(ok(m) for m in self.messages), 30)
            return next(m for m in self.messages if ok(m))
