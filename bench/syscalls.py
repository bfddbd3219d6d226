"""System calls per request, counted by strace: python -m bench.syscalls [N] [--burst]

Wall-clock figures on a shared machine move with the neighbours' load; the number of
fsyncs, creates and renames a request costs does not. Counts every thread of a
broker serving N bench.noop requests (sequentially, or as one burst), per request.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import cases, procs

WATCHED = (
    "fsync", "fdatasync", "openat", "renameat", "unlinkat", "pwrite64", "write", "read",
    "futex", "poll", "newfstatat", "fcntl", "flock",
)  # fmt: skip


def count(n: int, burst: bool, effect: str = "bench.noop") -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="broker-syscalls-") as tmp:
        cells = cases.Cells(Path(tmp))
        out_file = Path(tmp) / "strace.txt"
        answered = {"n": 0}

        def around(server: procs.Server, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
            tracer = subprocess.Popen(
                ["strace", "-f", "-c", "-o", str(out_file), "-p", str(server.pid)],
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)
            try:
                found = work()
            finally:
                tracer.send_signal(signal.SIGINT)
                tracer.wait(30)
            warm = 30  # cases._exercise sends these first, inside the trace
            answered["n"] = warm + (found["burst"]["done"] if burst else found["n"])
            return found

        seq, many = (0, n) if burst else (n, 0)
        cases.broker(cells, effect, 1, seq, many, around=around)
        calls: dict[str, float] = {}
        for line in out_file.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[-1] in WATCHED and parts[3].isdigit():
                calls[parts[-1]] = int(parts[3]) / answered["n"]
        return calls


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 300
    found = count(n, "--burst" in sys.argv)
    for name in WATCHED:
        if name in found:
            print(f"  {name:<12} {found[name]:6.2f} per request")
