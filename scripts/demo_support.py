"""What the demos share: a scripted reviewer, the Docker check, headings."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

BROKER = str(Path(sys.executable).parent / "broker")


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def docker_ready() -> bool:
    """Whether a Docker engine answers (then the agent runs in a real sandbox)."""
    return bool(shutil.which("docker")) and (
        subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    )


def reviewer(
    env: dict[str, str], stop: threading.Event, *, effect: str | None = None, note: str
) -> None:
    """A person at another terminal: waits for a gated request, reads its card, approves."""
    while not stop.is_set():
        listing = subprocess.run(
            [BROKER, "pending", "--json"], env=env, capture_output=True, text=True
        )
        pending = json.loads(listing.stdout) if listing.returncode == 0 else []
        wanted = [p for p in pending if effect is None or p.get("effect") == effect]
        if wanted:
            ref = wanted[0]["ref"]
            say(f"a reviewer runs `broker show {ref}` in another terminal")
            subprocess.run([BROKER, "show", ref], env=env)
            say(f"the reviewer approves: broker approve {ref}")
            subprocess.run(
                [BROKER, "approve", ref, "--as", "demo-reviewer", "--reason", note], env=env
            )
            return
        stop.wait(0.3)
