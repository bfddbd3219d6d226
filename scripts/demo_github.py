"""`make demo-github`: an agent's pull request, end to end, on local stand-ins.

Everything runs on 127.0.0.1 and lives in .demo/github/:

- a bare git repository playing acme/api on GitHub, with a bug on main;
- the recording fake GitHub (tests/effects/github/fake.py) serving that repository:
  branches, blobs, trees, commits, compare and pull requests, with state;
- a broker with a policy: pushes to agent/* apply at once, pull requests wait for a person;
- an agent that fixes the bug and asks for a pull request;
- a reviewer (another thread here) who reads the approval card, diff included, and approves.

With Docker the agent runs in a sandbox (no network, no credentials, no git binary): it
sends the fixed file as `files`, and the host commits it on a new branch through the
Git Data API. Without Docker, or with DEMO_ATTACH=1, it runs as a local process in attach
mode, commits with git, sends the commit as a bundle with git.push, then asks for the
pull request with that branch as head. Either way the agent's result carries the URL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo_support import BROKER, docker_ready, reviewer, say  # noqa: E402

from tests.effects.github.fake import FakeGitHub, seed_repo  # noqa: E402

DEMO = Path(os.environ.get("DEMO_DIR") or ROOT / ".demo" / "github")  # DEMO_DIR: elsewhere (tests)
TOKEN_ENV = "DEMO_GITHUB_TOKEN"
TOKEN = "ghp_demo0000000000000000000000000000"  # the fake's token; never enters the sandbox
GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Agent",
    "GIT_AUTHOR_EMAIL": "agent@sandbox",
    "GIT_COMMITTER_NAME": "Agent",
    "GIT_COMMITTER_EMAIL": "agent@sandbox",
}

AGENT = r'''
"""The demo's agent: fix add() in src/calc.py and ask for a pull request."""
import json, os, shutil, subprocess, sys
import outbox

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "repo")


def head_sha():
    """The commit the checkout is on, read from .git (no git binary needed)."""
    git = os.path.join(REPO, ".git")
    ref = open(os.path.join(git, "HEAD")).read().strip().split(" ")[-1]
    loose = os.path.join(git, ref)
    if os.path.exists(loose):
        return open(loose).read().strip()
    for line in open(os.path.join(git, "packed-refs")):
        if line.strip().endswith(" " + ref):
            return line.split()[0]
    raise SystemExit("cannot read the checkout's commit")


def git(*args):
    return subprocess.run(["git", "-C", REPO, *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def say(text):
    print(f"agent: {text}", flush=True)


def main():
    base = head_sha()
    path = os.path.join(REPO, "src", "calc.py")
    fixed = open(path).read().replace("return a - b", "return a + b")
    pr = {
        "repo": "acme/api",
        "base": "main",
        "base_sha": base,
        "head": "agent/fix-add",
        "title": "Fix add(): it subtracted",
        "body": "add(2, 2) returned 0. Found while running the tests; @maintainers please "
                "have a look.",
        "labels": ["bug"],
    }
    if shutil.which("git") and not os.environ.get("DEMO_FILES"):
        say("committing the fix with git and sending it as a bundle (git.push)")
        open(path, "w").write(fixed)
        git("commit", "-q", "-am", "Fix add(): it subtracted")
        bundle = subprocess.run(["git", "-C", REPO, "bundle", "create", "-", "origin/main..HEAD"],
                                check=True, capture_output=True).stdout
        pushed = outbox.request(
            "git.push",
            {"remote": "origin", "branch": "agent/fix-add", "bundle": "fix",
             "expected_old": None},
            attachments={"fix": bundle}, reason="my fix, for a pull request", timeout=60)
        say(f"git.push: {pushed['status']}: {pushed['reason']}")
        if pushed["status"] != "applied":
            return 1
    else:
        say("no git here: sending the fixed file; the host commits it on a new branch")
        pr["files"] = [{"path": "src/calc.py", "content": fixed}]
    say("asking for a pull request (a person must approve it)")
    result = outbox.request("github.pull_request.create", pr,
                            reason="the fix for add(); tests pass locally", timeout=300)
    say(f"github.pull_request.create: {result['status']}: {result['reason']}")
    if result.get("output"):
        print("AGENT-RESULT " + json.dumps(result["output"]), flush=True)
    return 0 if result["status"] == "applied" else 1


sys.exit(main())
'''


def git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def setup(fake: FakeGitHub) -> Path:
    shutil.rmtree(DEMO, ignore_errors=True)
    for folder in ("state", "workspace"):
        (DEMO / folder).mkdir(parents=True)
    remote = DEMO / "acme-api.git"
    seed_repo(
        remote,
        {
            "README.md": "# acme/api\n\nA calculator service.\n",
            "src/calc.py": "def add(a, b):\n    return a - b\n",
        },
    )
    fake.add_repo("acme/api", remote)
    # the agent's checkout, as its harness would provide it in the workspace
    git("clone", "-q", str(remote), str(DEMO / "workspace" / "repo"))
    (DEMO / "workspace" / "agent_github.py").write_text(AGENT)
    (DEMO / "policy.toml").write_text(
        "# Read in a code review: what the agent may do alone, and what a person sees.\n"
        "[[rules]]\n"
        'effect = "git.push"\n'
        'when = { branch = "agent/*" }\n'
        'action = "auto"\n'
        'reason = "agent/* branches are the agents\' scratch space"\n\n'
        "[[rules]]\n"
        'effect = "github.pull_request.create"\n'
        'action = "approve"\n'
        'timeout = "10m"\n'
        'on_timeout = "deny"\n'
        'reason = "a person reads every pull request before it is opened"\n'
    )
    config = DEMO / "broker.toml"
    config.write_text(
        "[broker]\n"
        f'state_dir = "{DEMO / "state"}"\n'
        f'policy = "{DEMO / "policy.toml"}"\n'
        "allow_as = true\n\n"
        "[integrations.git]\n"
        'protected_branches = ["main"]\n\n'
        "[integrations.git.remotes.origin]\n"
        f'url = "{remote}"\n\n'
        "[integrations.github]\n"
        f'token_env = "{TOKEN_ENV}"\n'
        f'base_url = "{fake.url}"   # the fake; https://api.github.com for real\n'
        'repos = ["acme/*"]\n'
    )
    return config


def stream(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run `cmd`, showing its output as it comes; returns (exit code, that output)."""
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # `broker run` relays the sandbox's output on stderr
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "AGENT-RESULT " not in line:  # `broker run` indents what the sandbox prints
            print(line, end="", flush=True)
    return proc.wait(), "".join(seen)


def run_agent(env: dict[str, str]) -> tuple[int, str]:
    """Run the agent, sandboxed when Docker answers; returns (exit code, its output)."""
    workspace = DEMO / "workspace"
    if docker_ready() and not os.environ.get("DEMO_ATTACH"):
        say("the agent runs in a sandbox: no network, no credentials, no git")
        cmd = [BROKER, "run", "--name", "demo-github", "--workspace", str(workspace), "--"]
        # stdin is not a terminal: the reviewer thread decides, not broker run's prompt
        return stream([*cmd, "python3", "/workspace/agent_github.py"], env)
    say("the agent runs as a local process (attach mode): Docker is not used")
    box = DEMO / "state" / "sandboxes" / "demo-github"
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
            "demo-github",
        ],
        env=env,
    )
    try:
        time.sleep(1.0)
        agent_env = {
            **os.environ,
            **GIT_ENV,
            "OUTBOX_DIR": str(box / "outbox"),
            "RESULTS_DIR": str(box / "results"),
            "SANDBOX_ID": "demo-github",
            "PYTHONPATH": str(ROOT / "sandbox_images" / "client"),
        }
        agent_env.pop(TOKEN_ENV, None)
        return stream([sys.executable, str(workspace / "agent_github.py")], agent_env)
    finally:
        serve.terminate()
        serve.wait(30)


def main() -> int:
    with FakeGitHub(token=TOKEN) as fake:
        config = setup(fake)
        say(f"a fake GitHub serves acme/api at {fake.url}; its remote is {DEMO / 'acme-api.git'}")
        env = {**os.environ, "BROKER_CONFIG": str(config), TOKEN_ENV: TOKEN}
        stop = threading.Event()
        person = threading.Thread(
            target=reviewer,
            args=(env, stop),
            kwargs={"effect": "github.pull_request.create", "note": "read the diff"},
            daemon=True,
        )
        person.start()
        code, output = run_agent(env)
        stop.set()
        lines = [line for line in output.splitlines() if "AGENT-RESULT " in line]
        result = json.loads(lines[-1].split("AGENT-RESULT ", 1)[1]) if lines else {}
        say("what GitHub (the fake) now holds")
        for pull in fake.pulls("acme/api"):
            print(f"pull request #{pull['number']}: {pull['title']!r} {pull['head']} → ", end="")
            print(f"{pull['base']} ({pull['state']}), labels {pull['labels']}")
        if result.get("url"):
            with urllib.request.urlopen(result["url"], timeout=10) as page:
                print(f"GET {result['url']} →\n{page.read().decode()}")
        print("the calls the broker made, as the fake recorded them:")
        for call in fake.calls:
            print(f"  {call.status} {call.method:6} {call.route}")
        say("the audit log (broker audit tail) and its hash chain (broker audit verify)")
        subprocess.run([BROKER, "audit", "tail", "-n", "8"], env=env)
        subprocess.run([BROKER, "audit", "verify"], env=env)
    ok = code == 0 and bool(result.get("url"))
    if ok:
        say(f"the agent's pull request: {result['url']}")
    print(f"\ndemo-github {'passed' if ok else 'FAILED'}: state kept in {DEMO}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
