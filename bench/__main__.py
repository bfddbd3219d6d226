"""python -m bench [--quick] [--profile] [--native] [--skip SECTION ...] [--dir DIR] [--keep]

Measures in rounds (every cell once per round, the order reversed every other round),
each probed before and after (bench.quiet: file-system creates and fsyncs, the CPU
others use, steal). Prints one table from the quiet rounds only (each figure the
median over them, min–max in brackets, each ratio the median of per-round ratios,
with the rounds it came from), then each target as met, missed or inconclusive, and
writes it all, with every round's probes and every sample, to
bench/results/<date>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench import cases, report
from bench import credentials as credential_rows  # section 8, its own module
from bench.rounds import Run

RESULTS = Path(__file__).resolve().parent / "results"
SECTIONS = (
    *("baseline", "broker", "many", "fleet", "sandbox", "idle", "start", "peers", "agents"),
    *("credentials", "warm"),
)


def _say(what: str) -> None:
    print(f"bench: {what} ({time.monotonic() - _STARTED:.0f} s)", file=sys.stderr, flush=True)


_STARTED = time.monotonic()


def measure(args: argparse.Namespace, cells: cases.Cells, run: Run) -> None:
    """Rounds of interleaved cells, each probed before and after (bench.quiet): the
    sequential rounds first, then the bursts (a broker's burst leaves thousands of
    consumed files, which slows this file system down for minutes; see fsprobe). Odd
    rounds run their cells in the reverse order, so no cell always follows another."""
    plan = cases.QUICK if args.quick else cases.Plan()
    if args.quick:
        cases.BUDGET.update(seq_s=2.0, burst_s=6.0)
    want = set(SECTIONS) - set(args.skip)
    if args.native and want & {"baseline", "broker"}:
        want.add("native")  # the C prototype's row beside the floor and the broker
    pg = _postgres(run) if "fleet" in want else None
    if pg is None:
        want.discard("fleet")
    lives: list[tuple[str, cases.Live]] = []
    # the bench's own running servers: their CPU is not someone else's
    run.own_pids = lambda: (
        (pg.pids() if pg else []) + [s.pid for _, live in lives for s in live.servers]
    )
    try:
        lives.extend((label, start()) for label, start in _servers(cells, plan, want, pg))
        _say("servers up")
        for r in range(plan.repeats if lives else 0):
            with run.round("sequential"):
                for label, live in lives[:: -1 if r % 2 else 1]:
                    probe = run.probe(window=False)
                    run.add(label, {**live.exercise(plan.seq_n, 0), "probe": probe})
            _say(f"sequential {r + 1}/{plan.repeats} done")
        for r in range(plan.burst_repeats if any(live.bursts for _, live in lives) else 0):
            with run.round("burst"):
                for label, live in lives[:: -1 if r % 2 else 1]:
                    if live.bursts:
                        probe = run.probe(window=False)
                        run.add(label, {**live.exercise(0, plan.burst_n), "probe": probe})
            _say(f"burst {r + 1}/{plan.burst_repeats} done")
    finally:
        _close(lives)
        if pg is not None:
            pg.close()
        run.own_pids = list
    _containers(run, cells, plan, want)
    _others(args, run, cells, plan, want)


def _close(lives: list[tuple[str, cases.Live]]) -> None:
    while lives:
        lives.pop()[1].close()


def _servers(
    cells: cases.Cells, plan: cases.Plan, want: set[str], pg: _Postgres | None
) -> list[tuple[str, Callable[[], cases.Live]]]:
    """Every server cell of the plan, by row label, each to start (the same servers
    serve every round). The scale rows past `burst_outboxes_max` outboxes are
    measured in the sequential rounds only."""
    todo: list[tuple[str, Callable[[], cases.Live]]] = []
    if "baseline" in want or "broker" in want:
        todo.append(("raw", partial(cases.start_raw, cells)))
        todo.append(("raw+fsync", partial(cases.start_raw, cells, fsync=True)))
        todo.append(("floor", partial(cases.start_raw, cells, floor="journal")))
        todo.append(("floor files.write", partial(cases.start_raw, cells, floor="files.write")))
    if "broker" in want:
        for effect in ("bench.noop", "files.write"):
            todo.append((f"broker {effect}", partial(cases.start_broker, cells, effect, 1)))
    if "native" in want:
        todo.append(("native", partial(cases.start_native, cells)))
    if "fleet" in want and pg is not None:
        for brokers in plan.fleet_sizes:
            fleet = partial(cases.start_fleet, cells, brokers, pg.new_database)
            todo.append((f"fleet ×{brokers}", fleet))
    if "many" in want:
        for count in plan.outbox_counts[1:]:
            bursts = count <= plan.burst_outboxes_max
            many = partial(cases.start_broker, cells, "bench.noop", count, bursts=bursts)
            todo.append((f"broker bench.noop ×{count}", many))
    return todo


def _containers(run: Run, cells: cases.Cells, plan: cases.Plan, want: set[str]) -> None:
    """Sections 3 and 5: their work runs in containers, which the bench cannot count as
    its own CPU; their rounds are judged by the probes at their edges."""
    if want & {"sandbox", "start", "warm"}:
        why = cases.docker_ready()
        if why:
            run.notes.append(f"sandbox, start and warm sections skipped: {why}")
            want -= {"sandbox", "start", "warm"}
    if "sandbox" in want:
        n, b = plan.sandbox_seq_n, plan.sandbox_burst_n
        for r in range(plan.sandbox_repeats):
            with run.round("sandbox", own_known=False):
                todo: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                    ("sandbox raw", lambda: cases.sandbox_raw(cells, n, b))
                ]
                for effect in ("bench.noop", "files.write"):
                    todo.append(
                        (f"sandbox {effect}", partial(cases.sandbox_broker, cells, effect, n, b))
                    )
                for label, measured in todo[:: -1 if r % 2 else 1]:
                    run.add(label, measured())
        _say("sandbox done")
    if "start" in want:
        with cases.Starts(cells) as starts:
            for r in range(plan.start_repeats):
                with run.round("start", own_known=False):
                    run.add("start", starts.once(reverse=bool(r % 2)))
        _say("start done")
    if "warm" in want:  # the pool's idle cost and a start from it
        from bench import warm

        with run.round("warm", own_known=False):
            window = 5.0 if plan is cases.QUICK else 20.0
            found = warm.measure(cells.new("warm"), window_s=window, repeats=plan.start_repeats)
            run.add("warm", found)
        _say("warm done")


def _others(
    args: argparse.Namespace, run: Run, cells: cases.Cells, plan: cases.Plan, want: set[str]
) -> None:
    if "idle" in want:
        with run.round("idle"):
            for count, found in cases.idle(cells, plan.idle_counts, plan.idle_window_s).items():
                run.add(f"idle ×{count}", found)
        _say("idle done")
    if "peers" in want:
        with run.round("peers"):
            for kind in ("poll", "watchfiles"):
                run.add(kind, cases.peer(cells, kind, plan.peer_seq_n, plan.peer_burst_n))
    if "agents" in want:
        from bench import agents

        # quick: one timed start each, and fewer blocks and calls
        blocks, calls, starts = (10, 50, 1) if args.quick else (50, 300, 3)
        with run.round("agents", own_known=False):
            run.add("mcp", {"call_s": agents.mcp_calls(cells.base, calls)})
            if not cases.docker_ready():
                found = agents.executors(cells.base, blocks, starts)
                run.add("executors", found)
                run.add("agents", agents.ratios(found))
        _say("agents done")
    if "credentials" in want:
        with run.round("credentials"):
            credential_rows.measure_into(run, cells.base, args.quick)
        _say("credentials done")


class _Postgres:
    """The bench's own PostgreSQL (durable: fsync on), one new database per cell."""

    def __init__(self) -> None:
        from tests.pgserver import PASSWORD, PgServer

        self.server = PgServer(fsync=True)
        self.server.start()
        os.environ["BENCH_PG_PASSWORD"] = PASSWORD  # the brokers' password reference
        self._made = 0

    def new_database(self) -> str:
        self._made += 1
        return self.server.create_database(f"bench{self._made}")

    def pids(self) -> list[int]:
        """The postmaster (its reaped backends count in its own CPU times)."""
        try:
            return [int((self.server.data / "postmaster.pid").read_text().split()[0])]
        except (OSError, ValueError, IndexError):
            return []

    def close(self) -> None:
        self.server.destroy()


def _postgres(run: Run) -> _Postgres | None:
    try:
        return _Postgres()
    except Exception as exc:  # no binaries, no psycopg: the rest of the bench still runs
        run.notes.append(f"fleet section skipped: {exc}")
        return None


def _remove_later(base: Path) -> None:
    """Remove the run's files (tens of thousands) at the lowest CPU and I/O priority,
    without waiting: under load, the removal alone took longer than the quick plan. A
    run that starts meanwhile sees it in its probes, and its rounds say so."""
    argv = ["nice", "-n", "19", "ionice", "-c", "3", "rm", "-rf", "--", str(base)]
    try:
        subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL)
    except OSError:  # no nice or ionice: remove it here
        shutil.rmtree(base, ignore_errors=True)


def _git() -> dict[str, Any]:
    def out(*argv: str) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        except OSError:
            return ""

    return {
        "commit": out("git", "rev-parse", "HEAD").strip(),
        "dirty": sorted(
            line[3:] for line in out("git", "status", "--porcelain").splitlines() if line
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a < 2-minute run with fewer samples")
    parser.add_argument("--profile", action="store_true", help="profile the broker instead")
    parser.add_argument(
        "--native",
        action="store_true",
        help="add the C prototype of the accept path (bench/native) beside the floor",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=SECTIONS, metavar="SECTION")
    parser.add_argument("--dir", type=Path, help="where the run's files go (default: /tmp)")
    parser.add_argument("--keep", action="store_true", help="leave the run's files behind")
    parser.add_argument("--out", type=Path, help="the results JSON (default: bench/results/)")
    args = parser.parse_args(argv)
    # An installed broker has its bytecode (pip compiles it at install); with this set,
    # every `broker run` and server the bench starts would compile ~200 modules first.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

    base = Path(tempfile.mkdtemp(prefix="broker-bench-", dir=args.dir))
    cells = cases.Cells(base)
    started = time.monotonic()
    try:
        if args.profile:
            from bench import profile

            profile.run(cells, RESULTS / "profiles", quick=args.quick)
            return 0
        run = Run(base / "probes")
        measure(args, cells, run)
    finally:
        if not args.keep:
            _remove_later(base)
    text, rows = report.table(run)
    met = report.targets(run)
    stamp = dt.datetime.now(dt.UTC)
    print()
    print(text)
    print("targets:")
    for t in met:
        print(report.show_target(t))
    for note in run.notes:
        print(f"note: {note}")
    elapsed = time.monotonic() - started
    print(f"({elapsed:.0f} s; {'quick' if args.quick else 'full'} plan)")
    saved = {
        "date": stamp.isoformat(timespec="seconds"),
        "plan": "quick" if args.quick else "full",
        "seconds": elapsed,
        "git": _git(),
        "host": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "rounds": run.rounds_json(),
        "table": text,
        "rows": rows,
        "targets": met,
        "samples": run.samples,
        "notes": run.notes,
    }
    suffix = "-quick" if args.quick else ""
    save(saved, args.out or RESULTS / f"{stamp:%Y-%m-%dT%H%M%S}{suffix}.json")
    return 0


def save(saved: dict[str, Any], out: Path) -> None:
    """A run's JSON into `out` (bench/results/ unless --out), and where it went."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(saved, indent=1, ensure_ascii=False) + "\n")
    print(f"results: {out}")


if __name__ == "__main__":
    sys.exit(main())
