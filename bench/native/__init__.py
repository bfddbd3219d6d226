"""The native accept-path prototype (accept.c, README.md): built on demand with make.

`binary()` builds it if its sources changed (gcc, libsqlite3-dev and libssl-dev:
scripts/native-deps.sh) and returns its path; `python -m bench.native` measures it
beside the durable floor and the broker.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
BINARY = HERE / "build" / "accept"


def binary() -> Path:
    """The prototype, built first if it is missing or older than its sources."""
    done = subprocess.run(["make", "-s", "-C", str(HERE)], capture_output=True, text=True)
    if done.returncode != 0 or not BINARY.exists():
        raise RuntimeError(
            "bench/native did not build (run scripts/native-deps.sh for gcc, "
            f"libsqlite3-dev and libssl-dev):\n{done.stderr.strip()}"
        )
    return BINARY
