"""`make demo-autogen`: AutoGen's CodeExecutorAgent with the broker as its executor and gate.

The model is AutoGen's own ReplayChatCompletionClient (scripted replies: no model, no
network). The agent proposes two code blocks. Each is filed as a `code.execute`
request; a reviewer at "another terminal" reads its card (the literal code) and
decides from the CLI. The first is approved: it runs in a hardened sandbox (no network,
read-only root) and writes a report through the outbox. The second is denied, and the
reviewer's reason comes back into the conversation. The audit log ends the demo.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from demo_support import BROKER, docker_ready, say

ROOT = Path(__file__).resolve().parent.parent
DEMO = Path(os.environ.get("DEMO_DIR") or ROOT / ".demo-autogen")  # DEMO_DIR: elsewhere (tests)

REPORT = """\
import os, outbox
rows = [("alpha", 3), ("beta", 5), ("gamma", 8)]
total = sum(n for _, n in rows)
lines = "".join(f"- {k}: {n}\\n" for k, n in rows)
text = f"# Weekly counts\\n\\n{lines}\\ntotal: {total}\\n"
print("network interfaces here:", os.listdir("/sys/class/net"))
answer = outbox.request("files.write", {"path": "report.md", "content": text},
                        reason="the weekly report the user asked for")
print("report:", answer["status"], "-", answer["reason"])
"""
FETCH = "curl -fsS https://example.com/latest.csv -o latest.csv\n"


def setup() -> Path:
    shutil.rmtree(DEMO, ignore_errors=True)
    for folder in ("state", "exports"):
        (DEMO / folder).mkdir(parents=True)
    (DEMO / "policy.toml").write_text(
        "# code.execute has no rule: it is irreversible, so a person approves each block\n"
        "# (within 10 minutes, else it is denied). files.write is reversible: applied at once.\n"
        '[[rules]]\neffect = "code.execute"\naction = "approve"\ntimeout = "10m"\n'
        'reason = "generated code runs only once a person has read it"\n'
    )
    config = DEMO / "broker.toml"
    config.write_text(
        f'[broker]\nstate_dir = "{DEMO / "state"}"\npolicy = "{DEMO / "policy.toml"}"\n'
        f'allow_as = true\n\n[integrations.files]\nroot = "{DEMO / "exports"}"\n'
    )
    return config


def reviewer(env: dict[str, str], verdict: str, reason: str) -> threading.Thread:
    """A person at another terminal: reads the waiting code.execute card, then decides."""

    def run() -> None:
        import json
        import time

        while True:
            listing = subprocess.run(
                [BROKER, "pending", "--json"], env=env, capture_output=True, text=True
            )
            rows = [r for r in json.loads(listing.stdout or "[]") if r["effect"] == "code.execute"]
            if rows:
                break
            time.sleep(0.3)
        ref = rows[0]["ref"]
        say(f"a reviewer reads the card: broker show {ref}")
        subprocess.run([BROKER, "show", ref], env=env)
        say(f"the reviewer decides: broker {verdict} {ref} --reason {reason!r}")
        subprocess.run([BROKER, verdict, ref, "--as", "demo-reviewer", "--reason", reason], env=env)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


async def conversation(config: Path, env: dict[str, str]) -> None:
    from autogen_agentchat.agents import CodeExecutorAgent
    from autogen_agentchat.ui import Console
    from autogen_ext.models.replay import ReplayChatCompletionClient

    from broker.integrations.autogen import SandboxCodeExecutor, approval_func

    model = ReplayChatCompletionClient(
        [
            f"I will compute the counts and save the report.\n```python\n{REPORT}```",
            "The report is saved as report.md through the outbox.",
            f"First I need the latest data.\n```sh\n{FETCH}```",
            "Understood: I will work from the data I have instead of fetching it.",
        ]
    )
    async with SandboxCodeExecutor(config, timeout=60) as executor:
        agent = CodeExecutorAgent(
            "coder",
            code_executor=executor,
            model_client=model,
            approval_func=approval_func(executor=executor),
        )
        say(f"task 1, in sandbox {executor.sandbox_id}: the agent writes the weekly report")
        person = reviewer(env, "approve", "pure computation, writes one report")
        await Console(agent.run_stream(task="Write the weekly report."))
        await asyncio.to_thread(person.join)
        say("task 2: the agent wants to fetch data from the internet")
        person = reviewer(
            env, "deny", "no downloads: the sandbox has no network; use the data you have"
        )
        await Console(agent.run_stream(task="Update it with the latest data."))
        await asyncio.to_thread(person.join)


def main() -> int:
    if not docker_ready():
        print("demo-autogen needs a Docker engine: run `make docker` (as root) first")
        return 1
    config = setup()
    env = {**os.environ, "BROKER_CONFIG": str(config)}
    say("a CodeExecutorAgent whose executor is a sandbox and whose gate is the broker")
    asyncio.run(conversation(config, env))
    say("what the approved block wrote through the outbox:")
    report = next((DEMO / "exports").rglob("report.md"), None)  # exports/<sandbox>/
    print(report.read_text() if report is not None else "(no report.md)")
    say("the audit log: every request, decision and outcome, and who decided")
    subprocess.run([BROKER, "audit", "tail", "-n", "30"], env=env)
    subprocess.run([BROKER, "audit", "verify"], env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
