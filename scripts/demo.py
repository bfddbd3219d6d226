"""`make demo`: one agent, end to end, on the embedded defaults; says what it shows.

A sandboxed agent (a real Docker container with no network) when the engine is
available, else the same agent as a local process in attach mode. The web inbox is
served on 127.0.0.1:8700: at a terminal, the demo prints the URL and a token and waits
for you to approve or deny the gated request in the browser (or with `broker approve`);
without one (CI), a scripted reviewer approves it from the CLI after reading its card.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from demo_support import BROKER, docker_ready, reviewer, say

ROOT = Path(__file__).resolve().parent.parent
DEMO = Path(os.environ.get("DEMO_DIR") or ROOT / ".demo")  # DEMO_DIR: elsewhere (tests)


LISTEN = os.environ.get("DEMO_LISTEN", "127.0.0.1:8700")
INTERACTIVE = sys.stdin.isatty() and not os.environ.get("CI")


def token() -> tuple[str, str]:
    """A fresh approver token for the demo reviewer: (token, its sha256)."""
    import hashlib
    import secrets

    value = "bkr_" + secrets.token_urlsafe(32)
    return value, hashlib.sha256(value.encode()).hexdigest()


def setup(token_sha256: str) -> Path:
    shutil.rmtree(DEMO, ignore_errors=True)
    for folder in ("state", "exports", "workspace"):
        (DEMO / folder).mkdir(parents=True)
    shutil.copy(ROOT / "demo" / "agent.py", DEMO / "workspace" / "agent.py")
    (DEMO / "policy.toml").write_text(
        "# Read in a code review: what the agent may do alone, and what a person sees.\n"
        "[[rules]]\n"
        'effect = "files.write"\n'
        "when = { overwrite = true }\n"
        'action = "approve"\n'
        'timeout = "10m"\n'
        'on_timeout = "deny"\n'
        'reason = "an overwrite destroys the previous report"\n'
    )
    config = DEMO / "broker.toml"
    config.write_text(
        "[broker]\n"
        f'state_dir = "{DEMO / "state"}"\n'
        f'policy = "{DEMO / "policy.toml"}"\n'
        "allow_as = true\n\n"
        "[integrations.files]\n"
        f'root = "{DEMO / "exports"}"\n\n'
        "[approvers.demo-reviewer]\n"
        f'token_sha256 = "{token_sha256}"\n'
    )
    return config


def browser_hint(secret: str) -> None:
    say(f"a person decides: open http://{LISTEN}/ and sign in with this token")
    print(f"    {secret}", flush=True)
    print("    (or in another terminal: BROKER_CONFIG=.demo/broker.toml broker pending)")


def main() -> int:
    secret, digest = token()
    config = setup(digest)
    env = {**os.environ, "BROKER_CONFIG": str(config)}
    stop = threading.Event()
    person = threading.Thread(
        target=reviewer, args=(env, stop), kwargs={"note": "checked the diff"}, daemon=True
    )
    web = ["--listen", LISTEN]
    sandboxed = docker_ready() and not os.environ.get("DEMO_ATTACH")
    if sandboxed:
        say("running the agent in a sandbox: no network, no credentials, read-only results")
    else:
        say("Docker is not available: running the agent as a local process (attach mode)")
    if INTERACTIVE:
        browser_hint(secret)
    else:
        person.start()
    if sandboxed:
        workspace = ["--workspace", str(DEMO / "workspace")]
        code = subprocess.run(
            [
                BROKER,
                "run",
                "--name",
                "demo",
                *workspace,
                *web,
                "--",
                "python3",
                "/workspace/agent.py",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
        ).returncode
    else:
        box = DEMO / "state" / "sandboxes" / "demo"
        (box / "outbox").mkdir(parents=True)
        serve = subprocess.Popen(
            [
                BROKER,
                "serve",
                "--outbox",
                str(box / "outbox"),
                "--results",
                str(box / "results"),
                "--sandbox",
                "demo",
                *web,
            ],
            env=env,
        )
        agent_env = {
            **os.environ,
            "OUTBOX_DIR": str(box / "outbox"),
            "RESULTS_DIR": str(box / "results"),
            "SANDBOX_ID": "demo",
            "PYTHONPATH": str(ROOT / "sandbox_images" / "client"),
        }
        time.sleep(1.0)
        code = subprocess.run(
            [sys.executable, str(DEMO / "workspace" / "agent.py")], env=agent_env
        ).returncode
        serve.terminate()
        serve.wait(30)
    stop.set()
    say("what the host now holds")
    exports = DEMO / "exports"  # each sandbox writes below exports/<sandbox>/
    print(f"exports: {sorted(str(p.relative_to(exports)) for p in exports.rglob('*'))}")
    report = next(exports.rglob("report.md"), None)
    print(report.read_text() if report is not None else "(no report.md)")
    say("the audit log (broker audit tail), and its hash chain (broker audit verify)")
    subprocess.run([BROKER, "audit", "tail", "-n", "12"], env=env)
    subprocess.run([BROKER, "audit", "verify"], env=env)
    say("the approval-rate signal (broker stats)")
    subprocess.run([BROKER, "stats"], env=env)
    print(f"\ndemo {'passed' if code == 0 else 'FAILED'}: state kept in {DEMO}")
    return code


if __name__ == "__main__":
    sys.exit(main())
