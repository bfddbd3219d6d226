"""How quiet the machine is right now, recorded around every round of a run.

On this machine, creating files becomes many times slower for a while after many
files were deleted (and in some freshly made directories), fsync moves between
100 µs and 4 ms with the neighbours' writes, and other sessions share the two cores:
every figure of a run is only comparable with another's when their probes are alike,
and bench.quiet keeps only the rounds whose probes say the machine was quiet.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from bench.stats import percentile

CLK_TCK = os.sysconf("SC_CLK_TCK")
WINDOW_S = 0.3  # the probe's CPU window: long enough for 30 ticks a core
ENGINE = ("dockerd", "containerd", "runc", "conmon", "podman")  # and containerd-shim*


def cpu_counters() -> dict[str, float]:
    """The machine's CPU seconds so far (/proc/stat's first line): non-idle, steal, all."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq
    return {
        "busy_s": busy / CLK_TCK,
        "steal_s": steal / CLK_TCK,
        "all_s": (busy + idle + iowait + steal) / CLK_TCK,
    }


def own_cpu(pids: Iterable[int] = ()) -> float:
    """CPU seconds of this process, its reaped children, and `pids` (running servers
    that are the bench's own, such as its PostgreSQL, with their reaped children)."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(v) for v in stat[11:15]) / CLK_TCK  # utime stime cutime cstime
    return total


def engine_cpu_s() -> float:
    """utime + stime of the container engine's live processes (dockerd, containerd and
    its shims, runc; Podman's conmon), from /proc."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name.startswith(ENGINE):
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def settle_engine(limit_s: float = 5.0, step_s: float = 0.1, cores: float = 0.05) -> float:
    """Wait (at most `limit_s`) until the container engine has been idle for a step:
    a round of containers leaves the engine tearing the last ones down for a while, and
    a probe taken then would count the bench's own containers as others' work. Returns
    the seconds waited; an engine still busy at the limit is for the probe to judge."""
    start = time.monotonic()
    before = engine_cpu_s()
    while time.monotonic() - start < limit_s:
        time.sleep(step_s)
        now = engine_cpu_s()
        if 0 <= now - before <= cores * step_s:  # less: a process ended, which is work
            break
        before = now
    return time.monotonic() - start


def probe(
    parent: Path, n: int = 200, own: Iterable[int] = (), *, window: bool = True
) -> dict[str, float]:
    """µs per create of n small files in a new dir under `parent`; µs per small fsync;
    the CPU others used (in cores) and the steal share over a short window around
    both (`window`: made at least WINDOW_S long); and the counters bench.quiet compares
    between two probes."""
    own = list(own)
    start_wall, start_cpu, start_own = time.monotonic(), cpu_counters(), own_cpu(own)
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
    if window:
        time.sleep(max(0.0, start_wall + WINDOW_S - time.monotonic()))
    wall, cpu, mine = time.monotonic(), cpu_counters(), own_cpu(own)
    elapsed = wall - start_wall
    others = max(0.0, (cpu["busy_s"] - start_cpu["busy_s"]) - (mine - start_own)) / elapsed
    spent = cpu["all_s"] - start_cpu["all_s"]
    return {
        "loadavg_1m": os.getloadavg()[0],
        "create_p50_us": percentile(took, 50) * 1e6,
        "create_p99_us": percentile(took, 99) * 1e6,
        "fsync_p50_us": percentile(synced, 50) * 1e6,
        "others_cores": others,
        "steal_share": (cpu["steal_s"] - start_cpu["steal_s"]) / spent if spent > 0 else 0.0,
        "wall_s": wall,
        "busy_s": cpu["busy_s"],
        "steal_s": cpu["steal_s"],
        "own_s": mine,
    }
