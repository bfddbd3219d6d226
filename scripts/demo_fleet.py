"""`make demo-fleet`: two brokers on one PostgreSQL, as two hosts of a fleet would run.

Two "hosts" on this machine, alpha and beta, each with its own state dir and sandbox
root, share a PostgreSQL started for the demo (initdb + pg_ctl in a temporary dir,
127.0.0.1 only). An agent on each host asks to write a file; the policy wants a person.
A reviewer on beta approves alpha's request and one on alpha approves beta's, each
from their own host's CLI; each request is applied by its own host's broker. Then
`broker audit verify` on alpha checks every host's audit chain in the ledger and
alpha's local copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from demo_support import BROKER, say

ROOT = Path(__file__).resolve().parent.parent
DEMO = Path(os.environ.get("DEMO_DIR") or ROOT / ".demo-fleet")  # DEMO_DIR: elsewhere (tests)
sys.path.insert(0, str(ROOT))

from tests.pgserver import PASSWORD, PgServer  # noqa: E402

POLICY = """[[rules]]
effect = "files.write"
action = "approve"
reason = "a person reads what is written outside the sandbox"
timeout = "10m"
"""


def host(name: str, url: str) -> Path:
    base = DEMO / name
    (base / "state" / "sandboxes" / "agent" / "outbox").mkdir(parents=True)
    (base / "exports").mkdir()
    (base / "pgpass").write_text(PASSWORD + "\n", encoding="utf-8")
    (base / "policy.toml").write_text(POLICY, encoding="utf-8")
    (base / "broker.toml").write_text(
        "[broker]\n"
        f'state_dir = "{base / "state"}"\n'
        f'policy = "{base / "policy.toml"}"\n'
        f'ledger = "{url}"\n'
        f'ledger_password_file = "{base / "pgpass"}"\n'
        f'host_id = "{name}"\n'
        "allow_as = true\n\n"
        "[integrations.files]\n"
        f'root = "{base / "exports"}"\n',
        encoding="utf-8",
    )
    return base


def env(base: Path) -> dict[str, str]:
    return {**os.environ, "BROKER_CONFIG": str(base / "broker.toml"), "COLUMNS": "120"}


def ask(base: Path, rid: str, text: str) -> None:
    """What the agent in the sandbox does: a request file, written then renamed."""
    outbox = base / "state" / "sandboxes" / "agent" / "outbox"
    doc = {
        "version": 1,
        "id": rid,
        "effect": "files.write",
        "params": {"path": f"{rid}.txt", "content": text},
        "reason": "the report the user asked for",
    }
    (outbox / f".{rid}.tmp").write_text(json.dumps(doc), encoding="utf-8")
    os.rename(outbox / f".{rid}.tmp", outbox / f"{rid}.json")


def result(base: Path, rid: str, want: str, timeout: float = 30) -> dict[str, object]:
    path = base / "state" / "sandboxes" / "agent" / "results" / f"{rid}.json"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            found: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
            if found.get("status") == want:
                return found
        time.sleep(0.05)
    raise SystemExit(f"demo-fleet: {rid} did not become {want} within {timeout:g}s")


def serving(proc: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    """Wait for a broker's banner (or its one line of refusal)."""
    end = time.monotonic() + timeout
    while "serving" not in log.read_text(encoding="utf-8", errors="replace"):
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"demo-fleet: a broker did not start: {log.read_text()}")
        time.sleep(0.05)


def run(base: Path, *args: str) -> None:
    print(f"$ broker {' '.join(args)}    # on {base.name}", flush=True)
    done = subprocess.run([BROKER, *args], env=env(base))
    if done.returncode != 0:
        raise SystemExit(f"demo-fleet: `broker {' '.join(args)}` failed on {base.name}")


def main() -> None:
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()
    say("one PostgreSQL for the fleet (a temporary cluster on 127.0.0.1)")
    server = PgServer()
    brokers: list[subprocess.Popen[bytes]] = []
    try:
        server.start()
        url = server.create_database("fleet")
        print(url)
        alpha, beta = host("alpha", url), host("beta", url)
        say("two brokers, one per host: alpha and beta")
        for base in (alpha, beta):
            log = (base / "broker.log").open("wb")
            brokers.append(
                subprocess.Popen([BROKER, "serve"], env=env(base), stdout=log, stderr=log)
            )
        for proc, base in zip(brokers, (alpha, beta), strict=True):
            serving(proc, base / "broker.log")
        say("an agent on each host asks to write a file outside its sandbox")
        ask(alpha, "report-a", "written on alpha, approved on beta\n")
        ask(beta, "report-b", "written on beta, approved on alpha\n")
        result(alpha, "report-a", "pending")
        result(beta, "report-b", "pending")
        say("any host sees the whole fleet's pending requests")
        run(beta, "pending")
        say("a reviewer on beta approves alpha's request; one on alpha approves beta's")
        run(beta, "approve", "alpha.agent/report-a", "--as", "bea", "--reason", "looks right")
        run(alpha, "approve", "beta.agent/report-b", "--as", "al", "--reason", "fine")
        for base, rid in ((alpha, "report-a"), (beta, "report-b")):
            done = result(base, rid, "applied")
            # each sandbox writes below root/<sandbox>/, the sandbox as the fleet names it
            path = base / "exports" / f"{base.name}.agent" / f"{rid}.txt"
            written = path.read_text(encoding="utf-8").strip()
            print(f"{base.name}: {rid} {done['status']} ({done['decided_by']}): {written!r}")
        say("the fleet's audit chains, verified from alpha")
        run(alpha, "audit", "verify")
    finally:
        for proc in brokers:
            proc.terminate()
        for proc in brokers:
            proc.wait(30)
        server.destroy()
    say("done: both requests applied once, each by its own host's broker")


if __name__ == "__main__":
    main()
