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

from bench import cases, instructions, report
from bench.__main__ import RESULTS, _close, _git, _remove_later
from bench.native import binary
from bench.rounds import Run

CELLS: dict[str, Callable[[cases.Cells], cases.Live]] = {
    "raw": partial(cases.start_raw),
    "floor": partial(cases.start_raw, floor="journal"),
    "native": cases.start_native,
    "broker bench.noop": partial(cases.start_broker, effect="bench.noop", boxes=1),
}


def measure(run: Run, cells: cases.Cells, args: argparse.Namespace) -> None:
    """Sequential rounds, then burst rounds, every cell once per round, the order
    reversed in odd rounds."""
    lives: list[tuple[str, cases.Live]] = []
    run.own_pids = lambda: [s.pid for _, live in lives for s in live.servers]
    try:
        lives.extend((label, start(cells)) for label, start in CELLS.items())
        for r in range(args.rounds):
            with run.round("sequential"):
                for label, live in lives[:: -1 if r % 2 else 1]:
                    probe = run.probe(window=False)
                    run.add(label, {**live.exercise(args.seq, 0), "probe": probe})
            _say(f"sequential {r + 1}/{args.rounds}")
        for r in range(args.bursts):
            with run.round("burst"):
                for label, live in lives[:: -1 if r % 2 else 1]:
                    probe = run.probe(window=False)
                    run.add(label, {**live.exercise(0, args.burst), "probe": probe})
            _say(f"burst {r + 1}/{args.bursts}")
    finally:
        _close(lives)
        run.own_pids = list


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
        measure(run, cases.Cells(base), args)
    finally:
        _remove_later(base)
    text, rows = report.table(run)
    met = report.targets(run)
    print(text)
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
        "samples": run.samples,
    }
    out = args.out or RESULTS / f"{stamp:%Y-%m-%dT%H%M%S}-native.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(saved, indent=1, ensure_ascii=False) + "\n")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
