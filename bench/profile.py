"""Where the broker's time goes: py-spy (every thread) and cProfile (the loop) under load.

    python -m bench --profile [--quick]

Writes bench/results/profiles/<stamp>-<load>.{pyspy.txt,cprofile.txt}: for py-spy, the
share of samples per thread and the top functions by own and by inclusive time.
"""

from __future__ import annotations

import collections
import datetime as dt
import io
import pstats
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import cases, procs


def _pyspy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return found if Path(found).exists() else None


def summarise(collapsed: Path, top: int = 30) -> str:
    """Own and inclusive sample shares per function from py-spy's raw (collapsed) output."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        threads[frames[0]] += count
        if len(frames) > 1:
            own[frames[-1]] += count
        for frame in set(frames[1:]):
            incl[frame] += count
    out = [f"{total} samples"]
    out.append("\nby thread:")
    out += [f"  {n * 100 / total:5.1f}%  {name}" for name, n in threads.most_common()]
    out.append("\nown time (top):")
    out += [f"  {n * 100 / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    out.append("\ninclusive time (top):")
    out += [f"  {n * 100 / total:5.1f}%  {name}" for name, n in incl.most_common(top)]
    return "\n".join(out) + "\n"


def _with_pyspy(raw_out: Path) -> Callable[[procs.Server, Callable[[], dict[str, Any]]], Any]:
    def around(server: procs.Server, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        exe = _pyspy()
        if exe is None:
            raise RuntimeError("py-spy is not installed: pip install py-spy")
        spy = subprocess.Popen(
            [exe, "record", "--pid", str(server.pid), "--rate", "400", "--threads",
             "--format", "raw", "--output", str(raw_out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)
        try:
            return work()
        finally:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)

    return around


def run(cells: cases.Cells, folder: Path, *, quick: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    stamp = f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H%M%S}"
    burst_n, seq_n = (3000, 300) if quick else (10_000, 1000)
    loads = {"burst": (0, burst_n), "sequential": (seq_n, 0)}
    for load, (seq, burst) in loads.items():
        raw_out = cells.base / f"{load}.collapsed"
        found = cases.broker(cells, "bench.noop", 1, seq, burst, around=_with_pyspy(raw_out))
        text = f"py-spy, broker bench.noop, {load}: {found}\n\n" + summarise(raw_out)
        (folder / f"{stamp}-{load}.pyspy.txt").write_text(text)
        shutil.copy(raw_out, folder / f"{stamp}-{load}.collapsed")
        stats_file = cells.base / f"{load}.pstats"
        found = cases.broker(cells, "bench.noop", 1, seq, burst, cprofile=stats_file)
        if not stats_file.exists():  # killed mid-step: one wake-up outlived the stop timeout
            note = f"cProfile of the serve loop, {load}: no profile ({found}); the broker was "
            note += "killed because one wake-up outlived the 30 s stop timeout\n"
            (folder / f"{stamp}-{load}.cprofile.txt").write_text(note)
            continue
        buf = io.StringIO()
        stats = pstats.Stats(str(stats_file), stream=buf)
        stats.sort_stats("cumulative").print_stats(35)
        stats.sort_stats("tottime").print_stats(25)
        (folder / f"{stamp}-{load}.cprofile.txt").write_text(
            f"cProfile of the serve loop (main thread), {load}: {found}\n" + buf.getvalue()
        )
        print(f"bench: profiles of the {load} in {folder}/{stamp}-{load}.*", file=sys.stderr)
