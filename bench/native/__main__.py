"""python -m bench.native [--rounds N] [--bursts N] [--seq N] [--burst N] [--count N] [--no-count]

The C prototype of the accept path (bench/native) beside the raw loop, the durable
floor and the broker (bench.noop, one outbox), in the same interleaved rounds as
`make bench` (each probed before and after and judged quiet or noisy: bench.quiet),
then each one's user-space instructions per request under callgrind (bench.instructions),
which the neighbours' load hardly moves. Prints the table and the targets; writes
bench/results/<date>-native.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench import cases, instructions, procs, report
from bench.__main__ import RESULTS, _close, _git, _remove_later, save
from bench.native import binary
from bench.rounds import Run

CELLS: dict[str, Callable[[cases.Cells], cases.Live]] = {
    "raw": partial(cases.start_raw),
    "floor": partial(cases.start_raw, floor="journal"),
    "native": cases.start_native,
    "broker bench.noop": partial(cases.start_broker, effect="bench.noop", boxes=1),
}


def _times(live: cases.Live) -> tuple[float, float]:
    """User and system CPU seconds of the cell's server so far."""
    fields = Path(f"/proc/{live.servers[0].pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / procs.CLK_TCK, int(fields[12]) / procs.CLK_TCK


def _exercise(live: cases.Live, seq_n: int, burst_n: int) -> dict[str, Any]:
    """`live.exercise`, with the server's CPU split into user and system time per request."""
    user, system = _times(live)
    found = live.exercise(seq_n, burst_n)
    user_after, system_after = _times(live)
    done = max(1, found["burst"]["done"]) if burst_n else found["n"]
    kind = "burst" if burst_n else "seq"
    found[f"{kind}_user_us"] = (user_after - user) / done * 1e6
    found[f"{kind}_sys_us"] = (system_after - system) / done * 1e6
    return found


def show_split(run: Run) -> str:
    """CPU per request split into user and system time, every round (noisy or not)."""
    lines = ["server CPU per request, user + system µs (median of every round; noise not judged)"]
    for label in CELLS:
        cells = []
        for kind in ("seq", "burst"):
            user = run.figure(label, f"{kind}_user_us", quiet_only=False)
            system = run.figure(label, f"{kind}_sys_us", quiet_only=False)
            if user.runs:
                cells.append(f"{kind} {user.median:.0f} + {system.median:.0f}")
        lines.append(f"  {label:<18} " + "   ".join(cells))
    return "\n".join(lines)


def measure(run: Run, cells: cases.Cells, args: argparse.Namespace) -> dict[str, float]:
    """Sequential rounds, then burst rounds, every cell once per round, the order
    reversed in odd rounds; returns where the prototype's time went (its stage clock,
    summed over every round and divided by the requests)."""
    lives: list[tuple[str, cases.Live]] = []
    log = None
    run.own_pids = lambda: [s.pid for _, live in lives for s in live.servers]
    try:
        lives.extend((label, start(cells)) for label, start in CELLS.items())
        log = dict(lives)["native"].servers[0].log
        for r in range(args.rounds):
            with run.round("sequential"):
                for label, live in lives[:: -1 if r % 2 else 1]:
                    probe = run.probe(window=False)
                    run.add(label, {**_exercise(live, args.seq, 0), "probe": probe})
            _say(f"sequential {r + 1}/{args.rounds}")
        for r in range(args.bursts):
            with run.round("burst"):
                for label, live in lives[:: -1 if r % 2 else 1]:
                    probe = run.probe(window=False)
                    run.add(label, {**_exercise(live, 0, args.burst), "probe": probe})
            _say(f"burst {r + 1}/{args.bursts}")
    finally:
        _close(lives)
        run.own_pids = list
    return stages(log.read_text()) if log else {}


def stages(log: str) -> dict[str, float]:
    """The `stages {...}` line the prototype prints at exit (µs per request by stage)."""
    for line in log.splitlines():
        if line.startswith("stages "):
            found: dict[str, float] = json.loads(line.removeprefix("stages "))
            return found
    return {}


def counts(n: int, burst_n: int) -> dict[str, dict[str, dict[str, float]]]:
    """Instructions per request: sequential (n) and burst (burst_n), per cell."""
    found: dict[str, dict[str, dict[str, float]]] = {}
    for kind in ("floor", "native", "broker"):
        flags = {"floor": kind == "floor", "native": kind == "native"}
        found[kind] = {
            "sequential": instructions.count(n, **flags),
            "burst": instructions.count(burst_n, burst=True, **flags),
        }
        _say(f"instructions: {kind}")
    return found


def show_counts(found: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = ["instructions per request (callgrind, every thread; noise hardly moves them)"]
    floor = found["floor"]["sequential"]["per_request"]
    for kind, modes in found.items():
        seq, burst = modes["sequential"]["per_request"], modes["burst"]["per_request"]
        lines.append(
            f"  {kind:<8} sequential {seq / 1e6:7.3f} M ({seq / floor:5.1f}× the floor)"
            f"   burst {burst / 1e6:7.3f} M"
        )
    return "\n".join(lines)


_STARTED = time.monotonic()


def _say(what: str) -> None:
    print(f"bench.native: {what} ({time.monotonic() - _STARTED:.0f} s)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.native", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="sequential rounds")
    parser.add_argument("--bursts", type=int, default=2, help="burst rounds")
    parser.add_argument("--seq", type=int, default=1000, help="requests per sequential cell")
    parser.add_argument("--burst", type=int, default=5000, help="requests per burst cell")
    parser.add_argument("--count", type=int, default=200, help="sequential requests counted")
    parser.add_argument("--no-count", action="store_true", help="no callgrind counts")
    parser.add_argument("--out", type=Path, help="the results JSON")
    args = parser.parse_args(argv)
    binary()  # a build failure says what to install before any server starts
    base = Path(tempfile.mkdtemp(prefix="broker-bench-native-"))
    run = Run(base / "probes")
    try:
        split = measure(run, cases.Cells(base), args)
    finally:
        _remove_later(base)
    text, rows = report.table(run)
    met = report.targets(run)
    print(text)
    print(show_split(run))
    print(
        "the prototype's wall time per request by stage (µs, all rounds): "
        + ", ".join(f"{k.removesuffix('_us')} {v:.0f}" for k, v in split.items() if k != "requests")
    )
    print("targets:")
    for t in met:
        print(report.show_target(t))
    found: dict[str, Any] = {}
    if not args.no_count:
        found = counts(args.count, max(args.count, 1000))
        print(show_counts(found))
    stamp = dt.datetime.now(dt.UTC)
    saved = {
        "date": stamp.isoformat(timespec="seconds"),
        "plan": vars(args) | {"out": str(args.out or "")},
        "git": _git(),
        "rounds": run.rounds_json(),
        "table": text,
        "rows": rows,
        "targets": met,
        "instructions": found,
        "native_stages_us": split,
        "samples": run.samples,
    }
    save(saved, args.out or RESULTS / f"{stamp:%Y-%m-%dT%H%M%S}-native.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
