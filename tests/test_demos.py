"""The README's demos run as a user runs them (`make demo`, `demo-github`,
`demo-autogen`, `demo-fleet`), each in a directory of its own: a demo that breaks is a
broken first impression, whatever else passes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pgserver import bin_dir

ROOT = Path(__file__).resolve().parent.parent
DEMOS = [
    ("demo.py", "demo passed", "docker"),
    ("demo_github.py", "demo-github passed", None),
    ("demo_autogen.py", "chain intact", "docker"),
    ("demo_fleet.py", "done: both requests applied once, each by its own host's broker", "pg"),
]


def _docker() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("script", "last", "needs"), DEMOS, ids=[d[0] for d in DEMOS])
def test_the_demo_runs_to_its_end(
    tmp_path: Path, script: str, last: str, needs: str | None
) -> None:
    missing = {"docker": not _docker(), "pg": bin_dir() is None}.get(needs or "", False)
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{script} needs {needs}, which CI provides")
        pytest.skip(f"{script} needs {needs}")
    env = {
        **os.environ,
        "DEMO_DIR": str(tmp_path / "demo"),
        "DEMO_LISTEN": f"127.0.0.1:{_free_port()}",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert last in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
