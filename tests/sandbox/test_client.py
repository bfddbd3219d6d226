"""The in-sandbox client (sandbox_images/client/outbox.py), without Docker."""

from __future__ import annotations

import ast
import ctypes
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

CLIENT = Path(__file__).resolve().parents[2] / "sandbox_images" / "client" / "outbox.py"

Broker = Callable[..., Any]
Writer = Callable[[dict[str, Any]], None]


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run the client as a command, as an agent would, with only the sandbox's env."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "OUTBOX_DIR": os.environ["OUTBOX_DIR"],
        "RESULTS_DIR": os.environ["RESULTS_DIR"],
    }
    return subprocess.run(
        [sys.executable, str(CLIENT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    "module", ["outbox.py", "outbox_cli.py", "outbox_mcp.py", "outbox_mcp_tools.py"]
)
def test_client_is_plain_python_38(module: str) -> None:
    """The client (and its MCP server) parses as Python 3.8 and imports nothing outside
    the standard library but each other."""
    tree = ast.parse((CLIENT.parent / module).read_text(), feature_version=(3, 8))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    mine = {"__future__", "outbox", "outbox_cli", "outbox_mcp", "outbox_mcp_tools"}
    assert imported <= set(sys.stdlib_module_names) | mine


def test_request_file_appears_only_complete(
    outbox_client: ModuleType, outbox_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request is written under a dot-name and renamed into place complete."""
    renames: list[tuple[str, str, bytes, bool]] = []
    real_rename = os.rename

    def spy(src: str, dst: str) -> None:
        renames.append((Path(src).name, Path(dst).name, Path(src).read_bytes(), Path(dst).exists()))
        real_rename(src, dst)

    monkeypatch.setattr(outbox_client.os, "rename", spy)
    written = outbox_client.request(
        "files.write", {"path": "a.txt", "content": "hi"}, reason="test", wait=False
    )

    [(temp, final, data, existed)] = renames
    assert temp.startswith(".")
    assert final == f"{written['id']}.json"
    assert not existed
    assert json.loads(data) == json.loads((outbox_dir / final).read_bytes())
    assert sorted(p.name for p in outbox_dir.iterdir()) == [final]


def test_request_follows_the_protocol(outbox_client: ModuleType, outbox_dir: Path) -> None:
    """The request file carries version, a fresh valid id, effect, params, reason and key."""
    first = outbox_client.request(
        "github.pull_request.create",
        {"repo": "acme/api", "title": "Fix typo"},
        reason="fix a typo",
        idempotency_key="k-1",
        wait=False,
    )
    second = outbox_client.request("files.write", {}, wait=False)

    on_disk = json.loads((outbox_dir / f"{first['id']}.json").read_text())
    assert on_disk == {
        "version": 1,
        "id": first["id"],
        "effect": "github.pull_request.create",
        "params": {"repo": "acme/api", "title": "Fix typo"},
        "reason": "fix a typo",
        "idempotency_key": "k-1",
    }
    assert first["id"] != second["id"]
    for request in (first, second):
        assert 1 <= len(request["id"]) <= 64
        assert all(c.isalnum() or c in "_-" for c in request["id"])


def test_request_waits_past_pending_for_terminal_result(
    outbox_client: ModuleType, fake_broker: Broker
) -> None:
    """A pending result keeps request() waiting; the terminal one is returned."""
    fake_broker((0.05, "pending"), (0.3, "applied"))
    started = time.monotonic()

    result = outbox_client.request("files.write", {"path": "a"}, timeout=10)

    assert result["status"] == "applied"
    assert result["output"] == {"params": {"path": "a"}}
    assert time.monotonic() - started >= 0.3


def test_request_waits_by_polling_without_inotify(
    outbox_client: ModuleType, fake_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where libc has no inotify, request() still sees the result by polling."""

    def no_libc(*args: Any, **kwargs: Any) -> Any:
        raise OSError("no libc here")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    fake_broker((0.1, "denied"))

    result = outbox_client.request("files.write", {}, timeout=10)

    assert result["status"] == "denied"


def test_request_times_out_with_a_clear_error(outbox_client: ModuleType, outbox_dir: Path) -> None:
    """With no result in time, OutboxTimeout names the request and how to look later."""
    started = time.monotonic()

    with pytest.raises(outbox_client.OutboxTimeout) as caught:
        outbox_client.request("files.write", {}, timeout=0.3)

    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 3
    request_id = caught.value.request_id
    assert (outbox_dir / f"{request_id}.json").exists()
    assert f"outbox result {request_id}" in str(caught.value)


def test_pending_result_still_times_out(outbox_client: ModuleType, fake_broker: Broker) -> None:
    """A result that stays pending ends in OutboxTimeout that reports 'pending'."""
    fake_broker((0.0, "pending"))

    with pytest.raises(outbox_client.OutboxTimeout) as caught:
        outbox_client.request("files.write", {}, timeout=0.5)

    assert caught.value.last["status"] == "pending"
    assert "'pending'" in str(caught.value)


def test_attachments_are_written_before_the_request(
    outbox_client: ModuleType, outbox_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attachments land (atomically) before the request that lists them."""
    order: list[str] = []
    real_rename = os.rename

    def spy(src: str, dst: str) -> None:
        assert Path(src).name.startswith(".")
        order.append(Path(dst).name)
        real_rename(src, dst)

    monkeypatch.setattr(outbox_client.os, "rename", spy)
    bundle = bytes(range(256)) * 100

    written = outbox_client.request(
        "git.push", {"bundle": "fix"}, attachments={"fix": bundle}, wait=False
    )

    name = written["id"]
    assert order == [f"{name}.fix.bin", f"{name}.json"]
    assert (outbox_dir / f"{name}.fix.bin").read_bytes() == bundle
    assert json.loads((outbox_dir / f"{name}.json").read_text())["attachments"] == ["fix"]


def test_bad_attachment_name_writes_nothing(outbox_client: ModuleType, outbox_dir: Path) -> None:
    """An attachment name that could escape its file name is refused before any write."""
    with pytest.raises(ValueError, match="attachment name"):
        outbox_client.request("git.push", {}, attachments={"../x": b"1"}, wait=False)

    assert list(outbox_dir.iterdir()) == []


def test_cli_applied_exits_0_and_prints_result(fake_broker: Broker) -> None:
    """`outbox request` prints the result JSON and exits 0 when it is applied."""
    broker = fake_broker((0.05, "pending"), (0.1, "applied"))

    done = run_cli("request", "files.write", "--param", "path=a.txt", "--timeout", "20")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "applied"
    assert broker.request is not None
    assert broker.request["params"] == {"path": "a.txt"}


def test_cli_denied_exits_1_with_the_reason(fake_broker: Broker) -> None:
    """Any terminal status but applied exits 1, and the reason is printed."""
    fake_broker((0.05, "denied"))

    done = run_cli("request", "files.write", "--timeout", "20")

    assert done.returncode == 1
    assert json.loads(done.stdout)["reason"] == "denied by the fake broker"


def test_cli_builds_params_from_text_json_and_files(outbox_dir: Path, tmp_path: Path) -> None:
    """--param, --param-json and --param-file combine into the request's params."""
    note = tmp_path / "note.txt"
    note.write_text("line one\nline two\n")

    done = run_cli(
        "request",
        "files.write",
        "--param",
        "path=notes/a.txt",
        "--param-json",
        'mode={"append": true, "n": 3}',
        "--param-file",
        f"content={note}",
        "--reason",
        "save notes",
        "--idempotency-key",
        "notes-1",
        "--no-wait",
    )

    assert done.returncode == 0, done.stderr
    request_id = json.loads(done.stdout)["id"]
    written = json.loads((outbox_dir / f"{request_id}.json").read_text())
    assert written["params"] == {
        "path": "notes/a.txt",
        "mode": {"append": True, "n": 3},
        "content": "line one\nline two\n",
    }
    assert written["reason"] == "save notes"
    assert written["idempotency_key"] == "notes-1"


@pytest.mark.usefixtures("outbox_dir")
def test_cli_timeout_exits_2_with_one_line() -> None:
    """A timeout exits 2 with one line on stderr that says how to look later."""
    done = run_cli("request", "files.write", "--timeout", "0.3")

    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "outbox result" in line
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["request", "files.write", "--param", "no-equals-sign"],
        ["request", "files.write", "--param-json", "n={oops"],
        ["request", "files.write", "--param", "a=1", "--param", "a=2"],
        ["request", "files.write", "--timeout", "soon"],
        ["request", "files.write", "--param-file", "x=/does/not/exist"],
        ["request"],
        ["frobnicate"],
        [],
        ["result", "../../etc/passwd"],
    ],
)
def test_cli_usage_errors_exit_2_with_one_line(outbox_dir: Path, args: list[str]) -> None:
    """Usage mistakes exit 2 with a single error line and no traceback, writing nothing."""
    done = run_cli(*args)

    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("outbox: error:")
    assert list(outbox_dir.iterdir()) == []


def test_cli_unusable_outbox_exits_2(outbox_dir: Path) -> None:
    """An outbox that cannot be written is one clear line and exit 2."""
    outbox_dir.rmdir()

    done = run_cli("request", "files.write", "--timeout", "1")

    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert str(outbox_dir) in line


def test_cli_result_prints_and_exits_by_status(result_writer: Writer) -> None:
    """`outbox result ID` prints the result: 0 if applied, 1 if not, 2 if there is none."""
    result_writer({"version": 1, "id": "ok-1", "status": "applied"})
    result_writer({"version": 1, "id": "no-1", "status": "failed"})

    applied = run_cli("result", "ok-1")
    failed = run_cli("result", "no-1")
    missing = run_cli("result", "nope")

    assert (applied.returncode, json.loads(applied.stdout)["status"]) == (0, "applied")
    assert (failed.returncode, json.loads(failed.stdout)["status"]) == (1, "failed")
    assert missing.returncode == 2
    assert "no result for request nope" in missing.stderr


@pytest.mark.usefixtures("outbox_dir")
def test_cli_help_documents_exit_status() -> None:
    """`outbox --help` exits 0 and explains the exit status."""
    done = run_cli("--help")

    assert done.returncode == 0
    assert "Exit status: 0 if the result is 'applied'" in done.stdout
