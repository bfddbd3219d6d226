"""Helpers for running `broker serve` as a real process against a real local receiver.

Shared by the crash-injection and hostile-sandbox suites: the effect plugin under
plugin/ is found through a minimal `*.dist-info` with an `entry_points.txt`, so the
broker loads it exactly as it loads any third-party plugin.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from broker.audit import verify as audit
from broker.models import TERMINAL, Record
from broker.store.sqlite import Ledger
from broker.validation import load_schema

BROKER = Path(sys.executable).with_name("broker")
PLUGIN_DIR = Path(__file__).resolve().parent / "plugin"
RESULT_SCHEMA = Draft202012Validator(load_schema("result"))
OUTCOME_EVENTS = TERMINAL


def soak() -> bool:
    """Long variants run when BROKER_SOAK=1 (`make soak` sets it)."""
    return os.environ.get("BROKER_SOAK", "") not in ("", "0")


# -- the receiving service ---------------------------------------------------------


class Receiver:
    """An HTTP service on 127.0.0.1 that counts deliveries by X-Delivery-Id.

    `posts[id]` counts every POST; `applied[id]` counts effects that happened: a POST
    with an Idempotency-Key it has already seen is acknowledged but not applied again.
    """

    def __init__(self) -> None:
        self.posts: Counter[str] = Counter()
        self.applied: Counter[str] = Counter()
        self.effects: dict[str, str] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                delivery = self.headers.get("X-Delivery-Id", "")
                key = self.headers.get("Idempotency-Key")
                with receiver.lock:
                    receiver.posts[delivery] += 1
                    receiver.effects[delivery] = self.headers.get("X-Effect", "")
                    if key is None or receiver.applied[delivery] == 0:
                        receiver.applied[delivery] += 1
                    count = receiver.posts[delivery]
                data = json.dumps({"deliveries": count}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def count(self, delivery: str) -> tuple[int, int]:
        """(POSTs received, effects applied) for one delivery id."""
        with self.lock:
            return self.posts[delivery], self.applied[delivery]


# -- the plugin, installed as a distribution would be -------------------------------


def install_plugin(where: Path) -> str:
    """A PYTHONPATH under which `crashtest.*` effects register through the entry point."""
    dist = where / "crashtest_effects-1.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: crashtest-effects\nVersion: 1.0\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        "[broker.effects]\ncrashtest = crashtest_effects:HANDLERS\n", encoding="utf-8"
    )
    return os.pathsep.join([str(where), str(PLUGIN_DIR)])


def broker_env(pythonpath: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment for a broker process (no BROKER_* from the caller)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BROKER_", "PYTEST_", "COV_")) and k != "PYTHONPATH"
    }
    env["PYTHONPATH"] = pythonpath
    env["COLUMNS"] = "200"
    env.update(extra or {})
    return env


# -- one broker process -------------------------------------------------------------


@dataclass
class Site:
    """A served place: config, state dir, and (attach mode) one outbox with its results."""

    root: Path
    receiver_url: str
    policy: str = ""
    broker_extra: str = ""
    attach: bool = True
    sandbox: str = "default"
    pythonpath: str = ""
    claim: Path | None = None  # attach mode: a claim dir of its own (--claim)

    def __post_init__(self) -> None:
        self.outbox = self.root / "outbox"
        self.results = self.root / "results"
        self.state = self.root / "state"
        self.config = self.root / "broker.toml"
        for d in (self.outbox, self.results, self.state):
            d.mkdir(parents=True, exist_ok=True)
        (self.root / "policy.toml").write_text(self.policy, encoding="utf-8")
        self.config.write_text(
            "[broker]\n"
            f'state_dir = "{self.state}"\n'
            f'policy = "{self.root / "policy.toml"}"\n'
            f"{self.broker_extra}\n"
            "[integrations.crashtest]\n"
            f'url = "{self.receiver_url}"\n',
            encoding="utf-8",
        )
        if not self.pythonpath:
            self.pythonpath = install_plugin(self.root / "site-packages")

    def serve_args(self) -> list[str]:
        args = [str(BROKER), "serve", "--config", str(self.config)]
        if self.attach:
            args += ["--outbox", str(self.outbox), "--results", str(self.results)]
            args += ["--sandbox", self.sandbox]
            if self.claim is not None:
                args += ["--claim", str(self.claim)]
        return args

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run `broker ARGS --config <this site>` as a person would."""
        return subprocess.run(
            [str(BROKER), *args, "--config", str(self.config)],
            capture_output=True,
            text=True,
            env=broker_env(self.pythonpath),
            timeout=timeout,
            check=False,
        )

    def start(self, crash_at: str | None = None, log_name: str = "broker.log") -> BrokerProcess:
        extra = {"BROKER_CRASH_AT": crash_at} if crash_at else {}
        return BrokerProcess.start(
            self.serve_args(), broker_env(self.pythonpath, extra), self.root / log_name
        )

    def write(self, name: str, data: bytes | str | Mapping[str, Any]) -> None:
        write_atomically(self.outbox, name, data)

    def results_now(self) -> dict[str, dict[str, Any]]:
        return read_results(self.results)

    def ledger(self) -> list[Record]:
        ledger = Ledger(self.state / "ledger.sqlite3")
        try:
            return ledger.all()
        finally:
            ledger.close()


@dataclass
class BrokerProcess:
    """`broker serve` in its own process group, its output in a log file."""

    proc: subprocess.Popen[bytes]
    log: Path
    peak_rss_kib: int = 0
    _sampler: threading.Thread | None = field(default=None, repr=False)
    _sampling: bool = False

    @classmethod
    def start(cls, args: list[str], env: dict[str, str], log: Path) -> BrokerProcess:
        out = log.open("ab")
        try:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd=log.parent
            )
        finally:
            out.close()
        return cls(proc, log)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, as Ctrl-C would; the exit code (SIGKILL after `timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.wait(timeout)
        if code is None:
            self.proc.kill()
            code = self.proc.wait()
        self.stop_sampling()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stop_sampling()

    def rss_kib(self) -> int:
        """Resident memory now (0 once the process is gone)."""
        try:
            text = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def sample_memory(self, every: float = 0.05) -> None:
        """Track peak resident memory from a thread until stop_sampling()."""
        self._sampling = True

        def run() -> None:
            while self._sampling and self.proc.poll() is None:
                self.peak_rss_kib = max(self.peak_rss_kib, self.rss_kib())
                time.sleep(every)

        self._sampler = threading.Thread(target=run, daemon=True)
        self._sampler.start()

    def stop_sampling(self) -> None:
        self._sampling = False
        if self._sampler is not None:
            self._sampler.join(5)
            self._sampler = None

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def started(self, timeout: float = 120) -> bool:
        """Whether the broker got as far as serving (its banner) or has already exited;
        a start slowed by a busy machine is waited for, not counted as a hang."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None or "serving sandboxes" in self.output():
                return True
            time.sleep(0.05)
        return False


# -- files ------------------------------------------------------------------------------


def write_atomically(folder: Path, name: str, data: bytes | str | Mapping[str, Any]) -> None:
    """Write a file the way the protocol asks agents to: a temporary name, then rename."""
    if isinstance(data, Mapping):
        data = json.dumps(data)
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = folder / f".{uuid.uuid4().hex}.tmp"
    tmp.write_bytes(data)
    os.rename(tmp, folder / name)


def read_results(folder: Path) -> dict[str, dict[str, Any]]:
    """Every result under its final name, parsed (temporary names skipped)."""
    found: dict[str, dict[str, Any]] = {}
    for path in folder.iterdir():
        if path.name.startswith(".") or not path.name.endswith(".json"):
            continue
        try:
            found[path.name.removesuffix(".json")] = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
    return found


def schema_problems(result: Mapping[str, Any]) -> list[str]:
    return [e.message for e in RESULT_SCHEMA.iter_errors(dict(result))]


def wait_for(condition: Callable[[], bool], timeout: float, what: str, every: float = 0.02) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def terminal_ids(results: Mapping[str, Mapping[str, Any]]) -> set[str]:
    return {i for i, r in results.items() if r.get("status") in TERMINAL}


# -- the audit log against the ledger ---------------------------------------------------


def audit_events(state: Path) -> list[dict[str, Any]]:
    return [e for _, e, _ in audit.read_events(state / "audit.jsonl") if e is not None]


def audit_disagreements(state: Path) -> list[str]:
    """What makes the audit log and the ledger tell different stories (empty: none).

    The chain verifies up to the ledger's head; every ledger request has exactly one
    `received` event; a terminal request's last outcome event names its state.
    """
    ledger = Ledger(state / "ledger.sqlite3")
    try:
        head = ledger.audit_head()
        records = ledger.all()
        backlog = ledger.audit_backlog()
    finally:
        ledger.close()
    problems: list[str] = []
    _, fault = audit.verify(state / "audit.jsonl", head)
    if fault is not None:
        problems.append(f"audit line {fault.line}: {fault.problem}")
    if backlog:
        problems.append(f"{len(backlog)} audit event(s) still queued in the ledger")
    events = audit_events(state)
    received = Counter((e["sandbox"], e["id"]) for e in events if e.get("event") == "received")
    last_outcome: dict[tuple[str, str], str] = {}
    for e in events:
        kind = e.get("event")
        if kind in OUTCOME_EVENTS:
            last_outcome[(e["sandbox"], e["id"])] = str(kind)
        elif kind == "replayed" and e.get("status") in TERMINAL:
            last_outcome[(e["sandbox"], e["id"])] = str(e["status"])
    for r in records:
        if r.sandbox == "host":
            continue  # undo requests of the host are not received from a sandbox
        if received[r.key] != 1:
            problems.append(f"{r.sandbox}/{r.id}: {received[r.key]} `received` events")
        if r.terminal and last_outcome.get(r.key) != r.state:
            problems.append(
                f"{r.sandbox}/{r.id}: ledger says {r.state}, "
                f"the audit log's last outcome says {last_outcome.get(r.key)}"
            )
    extra = set(received) - {r.key for r in records}
    problems.extend(f"{s}/{i}: received in the audit log, absent from the ledger" for s, i in extra)
    return problems


def counts_by(items: Iterable[str]) -> dict[str, int]:
    return dict(Counter(items))


# -- the figures the suite prints ------------------------------------------------------


@dataclass
class Figures:
    """Totals over every crash run of the session, printed at its end."""

    runs: int = 0
    points: int = 0
    lost: int = 0
    duplicated: int = 0
    redelivered: int = 0
    unknown: int = 0
    pending_across: int = 0
    disk_full: str = ""

    def record(self, crashed: bool, lost: int, dup: int, redelivered: int, unknown: int) -> None:
        self.runs += 1
        self.points += int(crashed)
        self.lost += lost
        self.duplicated += dup
        self.redelivered += redelivered
        self.unknown += unknown

    def lines(self) -> list[str]:
        out = []
        if self.runs:
            out += [
                f"crash points: {self.points}, lost: {self.lost}, duplicated: {self.duplicated}",
                f"  ({self.runs} runs; idempotent redeliveries absorbed by the receiver: "
                f"{self.redelivered}; unknown outcomes reconciled: {self.unknown}; "
                f"approvals pending across a crash: {self.pending_across})",
            ]
        if self.disk_full:
            out.append(f"disk full: {self.disk_full}")
        return out


FIGURES = Figures()
