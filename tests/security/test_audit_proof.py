"""Finding 9: the audit log proves itself. Its chain is keyed with a key kept outside
the state dir, and signed checkpoints exported elsewhere show a re-sealed or cut log."""

from __future__ import annotations

import dataclasses
import json
import socket
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from broker.audit.checkpoints import audit_settings
from broker.audit.log import line_hash
from broker.config import load_config
from broker.errors import ConfigError
from broker.testing import BrokerHarness, FakeHandler
from tests.support import BROKER, eventually

KEY = "k3y-0f-the-audit-log-7c1e5b2d4f6a8e0c"


@dataclasses.dataclass
class Host:
    harness: BrokerHarness
    checkpoints: Path
    key_file: Path

    @property
    def log(self) -> Path:
        return self.harness.config.audit_path

    def verify(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BROKER), "audit", "verify", "--state", str(self.harness.state), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def write_lines(self, lines: list[dict[str, Any]]) -> None:
        self.log.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in lines))


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    """A broker with an audit key in /etc-like dir and a checkpoint file; it applied a
    few requests and stopped (exporting its last checkpoint)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    key_file = etc / "audit.key"
    key_file.write_text(KEY + "\n")
    exported = tmp_path / "export" / "checkpoints.jsonl"
    exported.parent.mkdir()
    audit = {"key_file": str(key_file), "checkpoint_file": str(exported), "checkpoint_every": 2}
    h = BrokerHarness(tmp_path / "h", handlers=[FakeHandler()])
    h.config = h.config._replace(audit=audit)
    (h.state / "broker.toml").write_text(
        f'[audit]\nkey_file = "{key_file}"\ncheckpoint_file = "{exported}"\n'
    )
    with h:
        for value in range(3):
            assert h.submit(h.request("test.record", {"value": value}))["status"] == "applied"
    yield Host(h, exported, key_file)


def test_a_keyed_log_and_its_checkpoints_verify(host: Host) -> None:
    """Every line is keyed; checkpoints were exported; verify says both hold."""
    assert all(e["alg"] == "hmac-sha256" for e in host.lines())
    points = [json.loads(line) for line in host.checkpoints.read_text().splitlines()]
    assert points and points[-1]["seq"] == host.lines()[-1]["seq"]
    done = host.verify("--checkpoints", str(host.checkpoints))
    assert done.returncode == 0, done.stderr
    assert "keyed" in done.stdout and "checkpoint(s) match" in done.stdout


def test_a_forged_append_with_a_recomputed_hash_is_detected(host: Host) -> None:
    """The issue's attack: append a decision line whose hash is recomputed (sha256, or
    marked keyed with a guessed key): verify names the line."""
    lines = host.lines()
    last = lines[-1]
    forged = {
        "seq": last["seq"] + 1, "at": last["at"], "event": "decision", "sandbox": "default",
        "id": "x", "effect": "test.record", "sha256": None, "by": "mallory",
        "verdict": "approve", "prev": last["hash"],
    }  # fmt: skip
    for variant in ({}, {"alg": "hmac-sha256"}):
        entry = {**forged, **variant}
        entry["hash"] = line_hash({k: v for k, v in entry.items() if k != "alg"})
        host.write_lines([*lines, entry])
        done = host.verify()
        assert done.returncode == 1
        assert f"line {len(lines) + 1}" in done.stderr
        assert "audit key" in done.stderr or "does not match" in done.stderr


def resealed(lines: list[dict[str, Any]], drop: int = 0) -> list[dict[str, Any]]:
    """The whole chain rewritten by someone without the key: sha256 hashes, a line
    changed, `drop` lines cut from the end."""
    out, prev = [], "0" * 64
    for entry in lines[: len(lines) - drop]:
        entry = {k: v for k, v in entry.items() if k not in ("alg", "hash")}
        if entry["event"] == "applied":
            entry["reason"] = "nothing to see"
        entry["prev"] = prev
        entry["hash"] = prev = line_hash(entry)
        out.append(entry)
    return out


def reset_ledger_head(host: Host) -> None:
    """What a state-dir writer does too: make the ledger's anchor agree with the log."""
    db = sqlite3.connect(host.harness.config.ledger_path)
    try:
        keys = [r[0] for r in db.execute("SELECT key FROM meta") if "audit" in r[0]]
        assert keys, "the ledger keeps an audit anchor"
        for key in keys:
            db.execute("DELETE FROM meta WHERE key = ?", (key,))
        db.commit()
    finally:
        db.close()


def test_a_resealed_chain_is_detected_given_the_checkpoints(host: Host) -> None:
    """Re-sealed without the key (so unkeyed from the first line) and the ledger's anchor
    removed: verify with the exported checkpoints names the checkpoint it no longer holds."""
    lines = resealed(host.lines())
    host.write_lines(lines)
    reset_ledger_head(host)
    done = host.verify("--checkpoints", str(host.checkpoints))
    assert done.returncode == 1
    assert "re-sealed" in done.stderr


def test_a_log_cut_short_is_detected_given_the_checkpoints(host: Host) -> None:
    """The last lines removed (and the ledger's anchor with them): the last checkpoint
    names an event the log no longer reaches."""
    lines = host.lines()
    host.write_lines(lines[:-3])
    reset_ledger_head(host)
    done = host.verify("--checkpoints", str(host.checkpoints))
    assert done.returncode == 1
    assert "ends before it" in done.stderr


def test_a_forged_checkpoint_is_refused(host: Host, tmp_path: Path) -> None:
    """A checkpoint made up for the re-sealed log is not signed by the key."""
    lines = resealed(host.lines())
    host.write_lines(lines)
    reset_ledger_head(host)
    fake = tmp_path / "fake.jsonl"
    point = {"checkpoint": 1, "seq": lines[-1]["seq"], "hash": lines[-1]["hash"], "at": "x"}
    fake.write_text(json.dumps({**point, "mac": "0" * 64}) + "\n")
    done = host.verify("--checkpoints", str(fake))
    assert done.returncode == 1
    assert "not signed by the audit key" in done.stderr


def test_an_unkeyed_log_says_so(tmp_path: Path) -> None:
    """Without [audit] key, verify still checks the chain and says it is not keyed."""
    h = BrokerHarness(tmp_path / "h", handlers=[FakeHandler()])
    with h:
        assert h.submit(h.request("test.record", {"value": 1}))["status"] == "applied"
    done = subprocess.run(
        [str(BROKER), "audit", "verify", "--state", str(h.state)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert "not keyed: no [audit] key on this host" in done.stdout


def test_a_keyed_log_without_the_key_does_not_verify(host: Host) -> None:
    """Without [audit] key the keyed lines cannot be checked: verify says so, not ok."""
    (host.harness.state / "broker.toml").write_text("")
    done = host.verify()
    assert done.returncode == 1
    assert "no audit key was given" in done.stderr


def test_checkpoints_reach_syslog_and_a_webhook(tmp_path: Path) -> None:
    """The syslog sink (a Unix datagram socket) and a webhook each receive signed
    checkpoints; the syslog lines themselves verify the log."""
    received: list[dict[str, Any]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    web = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    syslog_path = tmp_path / "log.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(syslog_path))
    sock.settimeout(10)
    (tmp_path / "audit.key").write_text(KEY)
    audit = {
        "key_file": str(tmp_path / "audit.key"),
        "checkpoint_syslog": str(syslog_path),
        "checkpoint_webhook": f"http://127.0.0.1:{web.server_address[1]}/cp",
    }
    h = BrokerHarness(tmp_path / "h", handlers=[FakeHandler()])
    h.config = h.config._replace(audit=audit)
    try:
        with h:
            assert h.submit(h.request("test.record", {"value": 1}))["status"] == "applied"
        datagram = sock.recv(65536).decode()
        eventually(lambda: bool(received), timeout=10)
    finally:
        sock.close()
        web.shutdown()
        web.server_close()
    assert "broker-audit:" in datagram and '"mac"' in datagram
    assert received[-1]["checkpoint"] == 1 and len(received[-1]["mac"]) == 64
    captured = tmp_path / "syslog.txt"
    captured.write_text(datagram + "\n")
    (h.state / "broker.toml").write_text(f'[audit]\nkey_file = "{tmp_path / "audit.key"}"\n')
    done = subprocess.run(
        [str(BROKER), "audit", "verify", "--state", str(h.state), "--checkpoints", str(captured)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"key_file": "{state}/audit.key"}, "inside the state dir"),
        ({"key_env": "SHORT_AUDIT_KEY"}, "at least 16"),
        ({"checkpoint_file": "{tmp}/cp.jsonl"}, "signed with the audit key"),
        ({"key_file": "{tmp}/k", "checkpoint_file": "{state}/cp.jsonl"}, "inside the state dir"),
        ({"keyfile": "x"}, "unknown key"),
    ],
)
def test_audit_settings_that_would_not_protect_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: dict[str, str], message: str
) -> None:
    """A key in the state dir, a short key, checkpoints without a key, a typo: refused."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "audit.key").write_text(KEY)
    (tmp_path / "k").write_text(KEY)
    monkeypatch.setenv("SHORT_AUDIT_KEY", "short")
    lines = "".join(f'{k} = "{v.format(state=state, tmp=tmp_path)}"\n' for k, v in table.items())
    (tmp_path / "broker.toml").write_text(f'[broker]\nstate_dir = "{state}"\n[audit]\n{lines}')
    cfg = load_config(tmp_path / "broker.toml")
    with pytest.raises(ConfigError, match=message):
        audit_settings(cfg)


def _drop_meta(host: Host, key: str) -> None:
    db = sqlite3.connect(host.harness.config.ledger_path)
    try:
        db.execute("DELETE FROM meta WHERE key = ?", (key,))
        db.commit()
    finally:
        db.close()


def test_a_downgraded_log_is_refused_without_the_checkpoints(host: Host) -> None:
    """Issue 24 finding 2: every key mark stripped, a decision forged, the chain re-sealed
    with sha256 and the ledger's head reset: plain verify refuses it (the ledger's signed
    record says from which event every line is keyed) and says how to use checkpoints."""
    lines = resealed(host.lines())
    lines[-1]["by"] = "ceo"
    host.write_lines(resealed(lines))
    _drop_meta(host, "audit_head")
    done = host.verify()
    assert done.returncode == 1, done.stdout
    assert "line 1:" in done.stderr and "re-chained without the key" in done.stderr
    assert "--checkpoints" in done.stderr


def test_a_downgraded_log_with_every_audit_record_removed_is_refused(host: Host) -> None:
    """The same with the keyed-start record deleted too: a host with a key whose log has
    no keyed line at all is refused by plain verify, never "ok (keyed)"."""
    host.write_lines(resealed(host.lines()))
    reset_ledger_head(host)
    done = host.verify()
    assert done.returncode == 1, done.stdout
    assert "no line is keyed" in done.stderr and "--checkpoints" in done.stderr


def test_a_forged_keyed_start_record_is_refused(host: Host) -> None:
    """A keyed-start record moved past the end (so the stripped lines fall before it)
    is not signed by the key: refused."""
    host.write_lines(resealed(host.lines()))
    db = sqlite3.connect(host.harness.config.ledger_path)
    try:
        db.execute("UPDATE meta SET value = ? WHERE key = 'audit_keyed_from'", ('[999, "00"]',))
        db.commit()
    finally:
        db.close()
    _drop_meta(host, "audit_head")
    done = host.verify()
    assert done.returncode == 1, done.stdout
    assert "not signed by this audit key" in done.stderr
