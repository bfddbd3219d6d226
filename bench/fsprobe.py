"""How fast this file system creates files right now, recorded with every run.

On this machine, creating files becomes many times slower for a while after many
files were deleted (and in some freshly made directories); every figure of a run is
only comparable with another run's when their probes are alike.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.stats import percentile


def probe(parent: Path, n: int = 200) -> dict[str, float]:
    """µs per create of n small files in a new dir under `parent`; µs per small fsync."""
    parent.mkdir(parents=True, exist_ok=True)
    folder = parent / f"probe-{time.monotonic_ns()}"
    folder.mkdir()
    took = []
    data = b"x" * 200
    for i in range(n):
        start = time.perf_counter()
        fd = os.open(folder / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        os.write(fd, data)
        os.close(fd)
        took.append(time.perf_counter() - start)
    synced = []
    fd = os.open(folder / "fsync", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        for _ in range(20):
            os.write(fd, data)
            start = time.perf_counter()
            os.fsync(fd)
            synced.append(time.perf_counter() - start)
    finally:
        os.close(fd)
    return {
        "loadavg_1m": os.getloadavg()[0],
        "create_p50_us": percentile(took, 50) * 1e6,
        "create_p99_us": percentile(took, 99) * 1e6,
        "fsync_p50_us": percentile(synced, 50) * 1e6,
    }
